"""Attention-only layers (`ModelConfig.d_ff = 0`) and the lm task's in-context loss."""

from __future__ import annotations

import contextlib
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_heads import WordTokenizer, sentence_pairs, tiny_model

from aiayn import ModelConfig
from aiayn.analysis.heads import head_report
from aiayn.analysis.pruning import prune_heads
from aiayn.config.recipes import recipes_dir
from aiayn.data.lm import TokenBatch, prepare_lm_text
from aiayn.data.prepare import PrepareConfig
from aiayn.inference.decoding import start
from aiayn.inference.frozen import freeze
from aiayn.io.checkpoint import load_model, save_model
from aiayn.models import build_model
from aiayn.nn.hooks import run_with_cache
from aiayn.training.budget import forward_matmul_flops
from aiayn.training.recipe import load_recipe
from aiayn.training.tasks import build_task
from aiayn.training.tasks.lm import in_context_loss
from aiayn.training.trainer import train_from_recipe
from train_helpers import EN

VOCAB = 40


def attn_only(architecture: str = "decoder_only", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig.tiny(VOCAB, d_ff=0, dropout=0.0, architecture=architecture, **overrides)
    return build_model(cfg).eval()


def attention_by_hand(attn, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """Multi-head scaled dot-product self-attention with plain torch on `attn`'s weights."""
    b, t, _ = x.shape
    h = attn.n_heads

    def heads(linear):
        y = x @ linear.weight.T + linear.bias
        return y.view(b, t, h, -1).transpose(1, 2)  # (B, H, T, d)

    q, k, v = heads(attn.q_proj), heads(attn.k_proj), heads(attn.v_proj)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    if causal:
        scores = scores.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
    z = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
    return z @ attn.out_proj.weight.T + attn.out_proj.bias


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("architecture", ["decoder_only", "encoder_only"])
def test_an_attention_only_layer_is_attention_plus_residual(architecture, norm_first):
    model = attn_only(architecture, norm_first=norm_first, positional="learned")
    stack = model.decoder if architecture == "decoder_only" else model.encoder
    layer = stack.layers[0]
    assert layer.feed_forward is None and layer.ff_residual is None
    x = torch.randn(2, 5, 64)
    norm = (layer.self_residual if architecture == "decoder_only" else layer.attn_residual).norm
    with torch.no_grad():
        causal = architecture == "decoder_only"
        got = layer(x) if causal else layer(x, None)
        if norm_first:
            expected = x + attention_by_hand(layer.self_attn, norm(x), causal)
        else:
            expected = norm(x + attention_by_hand(layer.self_attn, x, causal))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_resid_post_equals_the_cross_residual_in_an_encoder_decoder():
    model = attn_only("encoder_decoder")
    src, tgt = torch.randint(3, VOCAB, (2, 6)), torch.randint(3, VOCAB, (2, 4))
    with torch.no_grad():
        _, cache = run_with_cache(model, src, tgt)
    for i in range(2):
        post = cache[f"decoder.layers.{i}.hook_resid_post"]
        torch.testing.assert_close(post, cache[f"decoder.layers.{i}.hook_resid_cross"])
        enc = cache[f"encoder.layers.{i}.hook_resid_post"]
        torch.testing.assert_close(enc, cache[f"encoder.layers.{i}.hook_resid_mid"])


def test_an_attention_only_gpt_decodes_freezes_and_reloads(tmp_path):
    model = attn_only(output_bias=True)
    ids = torch.randint(3, VOCAB, (2, 7))
    with torch.no_grad():
        logits = model(ids)
        assert logits.shape == (2, 7, VOCAB)
        # greedy decoding through `start`, against the whole sequence through forward
        decoding = start(model, ids)
        first = decoding.step(torch.full((2,), model.cfg.bos_id))
        torch.testing.assert_close(first, logits[:, -1], atol=1e-5, rtol=1e-5)
        token = first.argmax(-1)
        second = decoding.step(token)
        whole = model(torch.cat([ids, token[:, None]], dim=1))[:, -1]
        torch.testing.assert_close(second, whole, atol=1e-5, rtol=1e-5)
        frozen = freeze(model)
        torch.testing.assert_close(frozen(ids), logits, atol=1e-5, rtol=1e-5)
    loaded = load_model(save_model(model, tmp_path / "model.safetensors")).eval()
    assert loaded.cfg.d_ff == 0 and loaded.decoder.layers[0].feed_forward is None
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), logits, atol=0, rtol=0)


@pytest.mark.parametrize("architecture", ["decoder_only", "encoder_decoder", "encoder_only"])
def test_num_parameters_drops_exactly_the_feed_forward(architecture):
    with_ffn = build_model(ModelConfig.tiny(VOCAB, architecture=architecture))
    without = build_model(ModelConfig.tiny(VOCAB, d_ff=0, architecture=architecture))
    cfg = with_ffn.cfg
    d, f = cfg.d_model, cfg.d_ff
    # per layer: W1 (d x f) + b1 (f) + W2 (f x d) + b2 (d), and the sub-layer's LayerNorm
    per_layer = d * f + f + f * d + d + 2 * d
    layers = {"decoder_only": cfg.n_decoder_layers, "encoder_only": cfg.n_encoder_layers}
    n = layers.get(architecture, cfg.n_encoder_layers + cfg.n_decoder_layers)
    assert without.num_parameters() == with_ffn.num_parameters() - n * per_layer


def test_budget_counts_no_feed_forward_flops():
    with_ffn = ModelConfig.tiny(VOCAB)
    without = ModelConfig.tiny(VOCAB, d_ff=0)
    b, s, t = 3, 5, 7
    ffn = 2 * 2 * with_ffn.d_model * with_ffn.d_ff  # two products of d x F per position
    expected = forward_matmul_flops(with_ffn, b, s, t) - ffn * b * (2 * s + 2 * t)
    assert forward_matmul_flops(without, b, s, t) == expected


def test_a_negative_d_ff_is_refused_by_name():
    with pytest.raises(ValueError, match=r"ModelConfig\.d_ff must be >= 0.*got -1"):
        ModelConfig.tiny(VOCAB, d_ff=-1)


# ----- the in-context loss ------------------------------------------------------------


def test_in_context_loss_is_late_minus_early_by_hand():
    cfg = ModelConfig.tiny(VOCAB, architecture="decoder_only", max_len=20)
    task = build_task("lm", cfg, {"in_context_early": [0.1, 0.25], "in_context_late": [0.8, 1.0]})
    assert (task.early, task.late) == (range(2, 5), range(16, 20))
    torch.manual_seed(0)
    logits = torch.randn(3, 20, VOCAB)
    labels = torch.randint(3, VOCAB, (3, 20))
    labels[2, 17:] = cfg.pad_id  # a block cut short: its padded positions do not count
    per_position = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
    early = per_position[:, 2:5].mean()
    late = torch.cat([per_position[:2, 16:].flatten(), per_position[2, 16:17]]).mean()

    class Fixed(torch.nn.Module):
        """Returns the given logits, batch after batch."""

        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))
            self.outputs = iter([logits[:2], logits[2:]])

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return next(self.outputs) + self.w

    class Valid:
        def epoch(self, _):
            yield TokenBatch(torch.zeros(2, 20, dtype=torch.long), labels[:2], 40)
            yield TokenBatch(torch.zeros(1, 20, dtype=torch.long), labels[2:], 17)

    sums = in_context_loss(logits, labels, cfg.pad_id, task.early, task.late)
    assert (sums[1], sums[3]) == (9, 9)  # 3 rows x 3 early; 2 rows x 4 + 1 late
    task.valid = Valid()
    metrics = task.validation_metrics(Fixed(), contextlib.nullcontext)
    assert metrics["early_loss"] == pytest.approx(float(early), rel=1e-5)
    assert metrics["late_loss"] == pytest.approx(float(late), rel=1e-5)
    assert metrics["in_context_loss"] == pytest.approx(float(late - early), rel=1e-5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"in_context_early": [0.2, 0.1]}, r"lm in_context_early must have 0 <= a < b <= 1"),
        ({"in_context_late": [0.9, 1.5]}, r"lm in_context_late must have 0 <= a < b <= 1"),
        ({"in_context_late": 0.9}, r"lm in_context_late must be two fractions"),
        ({"window": 3}, r"takes no option 'window'"),
    ],
)
def test_bad_in_context_windows_are_refused_by_name(options, message):
    cfg = ModelConfig.tiny(VOCAB, architecture="decoder_only")
    with pytest.raises(ValueError, match=message):
        build_task("lm", cfg, options)


@pytest.mark.trains
def test_the_attention_only_recipe_trains_and_logs_the_in_context_loss(tmp_path):
    rng = np.random.default_rng(0)
    for name, n in (("train.txt", 200), ("valid.txt", 40)):
        lines = [" ".join(rng.choice(EN, size=rng.integers(3, 10))) for _ in range(n)]
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus = tmp_path / "lm"
    prepare_lm_text(tmp_path / "train.txt", corpus, "en", valid=tmp_path / "valid.txt",
                    config=PrepareConfig(vocab_size=60))  # fmt: skip
    recipe = load_recipe(
        recipes_dir() / "gpt-induction-attn-only-bible-en-cpu.yaml",
        [f"data.corpus={corpus}", "model.d_model=16", "model.n_heads=2", "model.max_len=20",
         "train.max_tokens=64", "train.max_steps=3", "train.valid_every_steps=3",
         "train.warmup=2", "train.checkpoint_every_minutes=null",
         "train.checkpoint_every_steps=3"],
    )  # fmt: skip
    assert recipe.model["d_ff"] == 0 and recipe.model["n_layers"] == 2
    run = tmp_path / "run"
    result = train_from_recipe(recipe, run, progress=False)
    assert result.steps == 3
    lines = (run / "metrics.jsonl").read_text().splitlines()
    valid = [r for r in map(json.loads, lines) if r["kind"] == "valid"]
    assert [r["step"] for r in valid] == [3]
    record = valid[0]
    assert record["in_context_loss"] == pytest.approx(record["late_loss"] - record["early_loss"])
    assert record["early_loss"] > 0 and math.isfinite(record["late_loss"])


def test_the_two_induction_recipes_differ_only_in_d_ff():
    a = load_recipe(recipes_dir() / "gpt-induction-attn-only-bible-en-cpu.yaml", ["data.corpus=/c"])
    b = load_recipe(recipes_dir() / "gpt-induction-bible-en-cpu.yaml", ["data.corpus=/c"])
    assert (a.model["d_ff"], b.model["d_ff"]) == (0, 4 * b.model["d_model"])
    assert a.model["n_layers"] == 2 and a.model["dropout"] == 0.0
    assert a.train == b.train and a.task_options == b.task_options
    assert a.train.valid_every_steps <= 100
    assert {**b.model, "d_ff": 0} == a.model


def test_pruning_heads_and_int8_work_without_feed_forward():
    model = tiny_model(d_ff=0)
    src, tgt = torch.randint(3, 12, (2, 5)), torch.randint(3, 12, (2, 4))
    pruned = prune_heads(model, {"decoder.0.self": [1]}).eval()
    # removing a head = masking it out in the unpruned model
    model.decoder.layers[0].self_attn.head_mask = torch.tensor([1.0, 0.0])
    with torch.no_grad():
        torch.testing.assert_close(pruned(src, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)
    model.decoder.layers[0].self_attn.head_mask = None
    report = head_report(model, WordTokenizer(), sentence_pairs(6), progress=False)
    assert len(report.heads) == 2 * 3 * 2  # encoder self, decoder self and cross, 2 heads
    assert math.isfinite(report.baseline_nll)
    gpt = attn_only()
    ids = torch.randint(3, VOCAB, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(freeze(gpt, torch.int8)(ids), gpt(ids), atol=0.1, rtol=0.1)


def test_a_frozen_attention_only_encoder_decoder_equals_the_literal_one():
    model = attn_only("encoder_decoder")
    src, tgt = torch.randint(3, VOCAB, (2, 6)), torch.randint(3, VOCAB, (2, 4))
    with torch.no_grad():
        torch.testing.assert_close(freeze(model)(src, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)
