"""What each head does: statistics and importance against hand computations on tiny models."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from aiayn import ModelConfig, Transformer
from aiayn.analysis.heads import head_report, punctuation_ids
from aiayn.analysis.viz import AttentionKind
from aiayn.cli import app
from aiayn.data.batch import Batch
from aiayn.models.encoder_decoder import attention_sublayers
from aiayn.nn.attention import attend
from aiayn.training.trainer import train_from_recipe
from infer_helpers import make_run
from train_helpers import RECIPE, make_corpus

WORDS = ["the", "house", "garden", "river", "tree", "stone", "light", "water", ".", ",", "!?"]


PIECES = ("<pad>", "<s>", "</s>", *(f"\u2581{w}" for w in WORDS))


class WordTokenizer:
    """Whitespace words as sentencepiece-style pieces ("▁word"); ids 0-2 are pad, bos, eos."""

    path = None
    pad_id, bos_id, eos_id = 0, 1, 2
    vocab_size = len(PIECES)

    def encode_batch(self, texts):
        return [[PIECES.index(f"\u2581{w}") for w in text.split()] for text in texts]

    def id_to_piece(self, token_id: int) -> str:
        return PIECES[token_id]


SUBLAYER = {
    AttentionKind.ENCODER: "encoder.{}.self",
    AttentionKind.DECODER: "decoder.{}.self",
    AttentionKind.CROSS: "decoder.{}.cross",
}


def sentence_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [
        (" ".join(rng.choices(WORDS, k=rng.randint(1, 7))), " ".join(rng.choices(WORDS, k=k)))
        for k in (rng.randint(1, 7) for _ in range(n))
    ]


def tiny_model(dtype: torch.dtype = torch.float32, **overrides) -> Transformer:
    torch.manual_seed(0)
    settings = dict(d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, max_len=16)
    cfg = ModelConfig.tiny(vocab_size=WordTokenizer.vocab_size, **{**settings, **overrides})
    return Transformer(cfg).to(dtype).eval()


def encoded(pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    tok = WordTokenizer()
    return list(
        zip(
            tok.encode_batch([s for s, _ in pairs]),
            tok.encode_batch([t for _, t in pairs]),
            strict=True,
        )
    )


def nll_sum(model: Transformer, pairs) -> float:
    """Summed NLL of the pairs' targets, one batch, by F.cross_entropy."""
    batch = Batch.from_pairs(encoded(pairs), 0, 1, 2)
    logits = model(batch.src, batch.tgt_in)
    return float(
        F.cross_entropy(logits.transpose(1, 2), batch.tgt_out, ignore_index=0, reduction="sum")
    )


def test_punctuation_pieces_are_those_of_punctuation_only():
    flags = punctuation_ids(WordTokenizer(), WordTokenizer.vocab_size)
    names = [p for p, f in zip(PIECES, flags.tolist(), strict=True) if f]
    assert names == ["\u2581.", "\u2581,", "\u2581!?"]


def test_a_previous_token_head_and_a_next_token_head_score_one_at_their_offsets():
    """Decoder self-attention head 0 looks at the previous token by construction, encoder
    head 1 at the next real one; padding queries (which the kernels send elsewhere) and
    queries with no key at that offset do not count."""
    model = tiny_model()
    # Each kernel edits a copy of attend's weights: the returned weights may be the softmax's
    # own output, which autograd keeps for the backward pass (an in-place edit breaks it).

    def previous_token(q, k, v, mask, causal, dropout_p, need_weights, bias):
        weights = attend(q, k, v, mask, causal, dropout_p, True, bias)[1].clone()
        t = torch.arange(q.size(-2))
        weights[:, 0] = F.one_hot((t - 1).clamp_min(0), k.size(-2)).to(q.dtype)
        return weights @ v, weights if need_weights else None

    def next_token(q, k, v, mask, causal, dropout_p, need_weights, bias):
        weights = attend(q, k, v, mask, causal, dropout_p, True, bias)[1].clone()
        last = mask[:, 0, 0, :].sum(-1, keepdim=True) - 1  # (B, 1) the last real key (eos)
        target = torch.minimum(torch.arange(q.size(-2))[None, :] + 1, last)  # (B, T)
        weights[:, 1] = F.one_hot(target, k.size(-2)).to(q.dtype)
        return weights @ v, weights if need_weights else None

    model.decoder.layers[1].self_attn.kernel = previous_token
    model.encoder.layers[0].self_attn.kernel = next_token
    report = head_report(model, WordTokenizer(), sentence_pairs(12), progress=False)
    by_name = {h.name: h for h in report.heads}
    assert by_name["decoder L1 H0"].offset_prev == 1.0
    assert by_name["encoder L0 H1"].offset_next == 1.0
    # Only each sentence's last token (eos) attends itself: one query per sentence.
    assert by_name["encoder L0 H1"].offset_same == report.sentences / report.source_tokens
    assert all(h.offset_next is None for h in report.heads if h.kind is AttentionKind.DECODER)
    assert all(h.offset_prev is None for h in report.heads if h.kind is AttentionKind.CROSS)


def test_entropy_confidence_and_key_shares_match_each_sentence_alone():
    """One batch with padding against each sentence's own maps, averaged over all real queries."""
    model = tiny_model()
    pairs = [("the house .", ""), ("the garden , stone tree light water", "tree , water !?")]
    report = head_report(model, WordTokenizer(), pairs, progress=False)
    assert report.sentences == 2 and report.target_tokens == 1 + 5

    punct = punctuation_ids(WordTokenizer(), WordTokenizer.vocab_size)
    per_kind: dict[tuple[AttentionKind, int], list] = {}
    for src_ids, tgt_ids in encoded(pairs):
        src = torch.tensor([[*src_ids, 2]])
        tgt_in = torch.tensor([[1, *tgt_ids]])
        with torch.no_grad():
            maps = model.attention_maps(src, tgt_in)
        for kind, layers, keys in (
            (AttentionKind.ENCODER, maps.encoder, src[0]),
            (AttentionKind.DECODER, maps.decoder, tgt_in[0]),
            (AttentionKind.CROSS, maps.cross, src[0]),
        ):
            for layer, w in enumerate(layers):
                per_kind.setdefault((kind, layer), []).append((w[0].double(), keys))
    for h in report.heads:
        rows = [(w[h.head], keys) for w, keys in per_kind[(h.kind, h.layer)]]  # (T, S) each

        def over_queries(
            per_query, rows=rows
        ) -> float:  # mean over every real query of both sentences
            return float(torch.cat([per_query(w, keys) for w, keys in rows]).mean())

        entropy = over_queries(lambda w, _: -(w * w.log()).nan_to_num().sum(-1))
        assert h.entropy == pytest.approx(entropy, abs=1e-6)
        assert h.confidence == pytest.approx(over_queries(lambda w, _: w.max(-1).values), abs=1e-6)
        on_punct = over_queries(lambda w, keys: w[:, punct[keys]].sum(-1))
        assert h.punctuation == pytest.approx(on_punct, abs=1e-6)
        if h.kind is AttentionKind.DECODER:
            assert h.eos is None
            assert h.bos == pytest.approx(over_queries(lambda w, _: w[:, 0]), abs=1e-6)
        else:
            assert h.bos is None
            assert h.eos == pytest.approx(over_queries(lambda w, _: w[:, -1]), abs=1e-6)
        if h.kind is AttentionKind.CROSS:  # an empty target (bos alone) says nothing
            w, _ = rows[1]
            strongest = w.argmax(-1).numpy()
            expected = (
                0.0
                if np.ptp(strongest) == 0
                else np.corrcoef(np.arange(len(strongest)), strongest)[0, 1]
            )
            assert h.monotonicity == pytest.approx(float(expected), abs=1e-9)
        else:
            assert h.monotonicity is None


def test_ablation_is_the_nll_increase_with_the_heads_columns_of_w_o_zeroed():
    model = tiny_model(torch.float64)
    pairs = sentence_pairs(10, seed=1)
    report = head_report(model, WordTokenizer(), pairs, batch_tokens=24, progress=False)
    tokens = sum(len(t) + 1 for _, t in encoded(pairs))
    assert report.target_tokens == tokens
    with torch.no_grad():
        baseline = nll_sum(model, pairs) / tokens
        assert report.baseline_nll == pytest.approx(baseline, abs=1e-6)
        for h in report.heads:
            name = SUBLAYER[h.kind].format(h.layer)
            pruned = copy.deepcopy(model)
            mha = attention_sublayers(pruned)[name]
            mha.out_proj.weight[:, h.head * mha.d_v : (h.head + 1) * mha.d_v] = 0.0
            expected = nll_sum(pruned, pairs) / tokens - baseline
            assert h.ablation == pytest.approx(
                expected, abs=1e-6
            )  # aiayn.training.loss sums in float32
    assert all(mha.head_mask is None for mha in attention_sublayers(model).values())


def test_gradient_importance_is_the_mean_absolute_per_sentence_finite_difference():
    """I_h = sum_x |dL(x)/dm_h| / tokens, each derivative a central difference on head_mask."""
    model = tiny_model(torch.float64, n_layers=1)
    pairs = sentence_pairs(5, seed=2)
    report = head_report(model, WordTokenizer(), pairs, progress=False)
    tokens = sum(len(t) + 1 for _, t in encoded(pairs))
    sublayers = attention_sublayers(model)
    found = {(SUBLAYER[h.kind].format(h.layer), h.head): h.gradient for h in report.heads}
    eps = 1e-5
    with torch.no_grad():
        for name, mha in sublayers.items():
            for head in range(mha.n_heads):
                step = torch.zeros(mha.n_heads, dtype=torch.float64)
                step[head] = eps
                total = 0.0
                for pair in pairs:
                    mha.head_mask = 1 + step
                    up = nll_sum(model, [pair])
                    mha.head_mask = 1 - step
                    down = nll_sum(model, [pair])
                    total += abs(up - down) / (2 * eps)
                mha.head_mask = None
                assert found[(name, head)] == pytest.approx(total / tokens, rel=1e-6)


# ----- the command ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("heads")
    corpus = make_corpus(root / "en-de", train_pairs=60)
    run = root / "run"
    overrides = [
        f"data.corpus={corpus}",
        "train.max_steps=2",
        "train.valid_every_steps=null",
        "train.valid_bleu_sentences=0",
    ]
    train_from_recipe(RECIPE, run, overrides, progress=False)
    return run


def test_the_command_writes_json_heat_maps_and_a_report(trained_run, tmp_path):
    out = tmp_path / "heads"
    result = CliRunner().invoke(
        app, ["heads", str(trained_run), "--sentences", "5", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "heads.json").read_text())
    assert (data["split"], data["sentences"]) == ("valid", 5)
    assert data["units"]["ablation"].startswith("nats/token")
    n_heads = 2 * 3  # tiny-test: one layer of each kind, two heads
    assert len(data["heads"]) == n_heads
    assert set(data["heads"][0]) >= {
        "kind",
        "layer",
        "head",
        "entropy",
        "confidence",
        "offset_-1",
        "offset_0",
        "offset_+1",
        "eos",
        "punctuation",
        "monotonicity",
        "ablation",
        "gradient",
    }
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "cross-monotonicity.png" in pngs and "encoder-offset_-1.png" in pngs
    assert "cross-offset_0.png" not in pngs and "decoder-eos.png" not in pngs
    assert all((out / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)
    report = (out / "report.md").read_text()
    assert "## Most confident" in report and "## Most monotone" in report
    printed = result.stdout.splitlines()
    assert str(out / "heads.json") in printed and str(out / "report.md") in printed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sentences", "0"], "--sentences must be at least 1"),
        (["--split", "dev"], "split must be one of"),
    ],
)
def test_bad_arguments_fail_in_one_line(trained_run, tmp_path, args, message):
    result = CliRunner().invoke(app, ["heads", str(trained_run), "--out", str(tmp_path), *args])
    assert result.exit_code == 1
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_a_run_without_a_corpus_fails_in_one_line(tmp_path):
    run = make_run(tmp_path)
    result = CliRunner().invoke(app, ["heads", str(run)])
    assert result.exit_code == 1
    assert "needs a run trained by aiayn with a corpus" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
