"""aiayn.inference.frozen: the frozen model computes what the literal one does, faster, and alone."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from test_marian import SHAPES, build_marian_directory

import aiayn.inference.frozen
import aiayn.inference.frozen_products
from aiayn import ModelConfig, Transformer, freeze
from aiayn.config import TrainConfig
from aiayn.inference.frozen import FrozenCrossAttention, FrozenLinear, FrozenSelfAttention
from aiayn.inference.kv_cache import LayerKV
from aiayn.inference.search import beam_search, greedy_search
from aiayn.io.marian import load_marian_model
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.masks import key_mask
from aiayn.training.optim import build_optimizer

EOS, PAD = 2, 0


@pytest.fixture(params=["transposed", "packed"])
def path(request, monkeypatch):
    """Run FrozenLinear through each CPU path: oneDNN-packed for every size, or never."""
    if request.param == "packed":
        if not aiayn.inference.frozen._ONEDNN:
            pytest.skip("PyTorch built without oneDNN")
        monkeypatch.setattr(aiayn.inference.frozen_products, "PACK_MIN_ELEMENTS", 0)
    return request.param


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_frozen_linear_equals_f_linear(path, relu, bias):
    weight, b = torch.randn(5, 6), torch.randn(5) if bias else None
    frozen = FrozenLinear(weight, b, relu)
    assert (frozen.packed is not None) == (path == "packed")
    for x in (torch.randn(3, 4, 6), torch.randn(1, 6), torch.randn(4, 12)[:, ::2]):  # strided too
        expected = F.linear(x, weight, b)
        expected = F.relu(expected) if relu else expected
        torch.testing.assert_close(frozen(x), expected, rtol=0, atol=1e-5)


def test_an_output_projection_takes_w_transposed_for_one_row_and_onednn_for_more(monkeypatch):
    if not aiayn.inference.frozen._ONEDNN:
        pytest.skip("PyTorch built without oneDNN")
    monkeypatch.setattr(aiayn.inference.frozen_products, "PACK_MIN_ELEMENTS", 0)
    weight, bias = torch.randn(40, 16), torch.randn(40)
    frozen = FrozenLinear(weight, bias, keep_transposed=True)
    assert frozen.packed is not None and frozen.weight_t is not None

    def products(x):
        with torch.profiler.profile() as prof:
            out = frozen(x)
        torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=0, atol=1e-5)
        names = {e.key for e in prof.key_averages()}
        return "aten::addmm" in names, any("linear_pointwise" in n for n in names)

    assert products(torch.randn(1, 1, 16)) == (True, False)  # a greedy step of one sentence
    assert products(torch.randn(4, 1, 16)) == (False, True)  # beam 4: oneDNN, as before
    packed_only = FrozenLinear(weight, bias)  # no W^T kept: one row stays on oneDNN
    assert packed_only.weight_t is None


def test_frozen_linear_in_bf16_and_float64(path):
    weight, bias = torch.randn(48, 64), torch.randn(48)
    x = torch.randn(20, 64)
    bf16 = FrozenLinear(weight.bfloat16(), bias.bfloat16())
    expected = F.linear(x.bfloat16(), weight.bfloat16(), bias.bfloat16())
    torch.testing.assert_close(bf16(x.bfloat16()), expected, rtol=2e-2, atol=2e-2)
    exact = FrozenLinear(weight.double(), bias.double())  # not a fast dtype: F.linear
    assert exact.packed is None
    torch.testing.assert_close(
        exact(x.double()), F.linear(x.double(), weight.double(), bias.double())
    )


def test_frozen_linear_copies_its_weight():
    weight = torch.randn(5, 6)
    frozen = FrozenLinear(weight, None)
    x = torch.randn(2, 6)
    before = frozen(x)
    weight.add_(1.0)
    torch.testing.assert_close(frozen(x), before)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_fused_qkv_self_attention_equals_the_literal_module(n_kv_heads):
    mha = MultiHeadAttention(d_model=16, n_heads=4, n_kv_heads=n_kv_heads, d_k=4, d_v=6).eval()
    frozen = FrozenSelfAttention(mha)
    x = torch.randn(3, 5, 16)
    mask = key_mask(torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] * 4 + [False]]))
    with torch.no_grad():
        for kwargs in ({"mask": mask}, {"causal": True}, {"mask": mask, "need_weights": True}):
            expected = mha(x, x, **kwargs)
            got = frozen(x, x, **kwargs)
            torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-5)
            if kwargs.get("need_weights"):
                torch.testing.assert_close(got[1], expected[1])
        literal_cache, frozen_cache = LayerKV(static=False), LayerKV(static=False)
        for t in range(5):
            step = x[:, t : t + 1]
            expected, _ = mha(step, step, causal=True, cache=literal_cache)
            got, _ = frozen(step, step, causal=True, cache=frozen_cache)
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
def test_query_rows_sharing_a_source_row_equal_a_repeated_source(need_weights):
    mha = MultiHeadAttention(d_model=16, n_heads=4, n_kv_heads=2, d_k=4, d_v=6).eval()
    frozen = FrozenCrossAttention(mha)
    memory = torch.randn(2, 5, 16)
    real = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    query = torch.randn(6, 2, 16)  # 3 beams per sentence
    rows = torch.arange(2).repeat_interleave(3)
    with torch.no_grad():
        expected, weights = mha(query, memory[rows], key_mask(real[rows]), need_weights=True)
        static = LayerKV(static=True, group=3)  # keys and values of 2 rows serve 6
        shared, shared_weights = frozen(
            query, memory, key_mask(real), cache=static, need_weights=need_weights
        )
    assert static.key.size(0) == 2
    torch.testing.assert_close(shared, expected, rtol=0, atol=1e-5)
    if need_weights:
        torch.testing.assert_close(shared_weights, weights)
    with pytest.raises(ValueError, match="cannot share"):
        frozen(torch.randn(5, 2, 16), memory, key_mask(real), cache=LayerKV(True, group=3))


# ----- whole models ---------------------------------------------------------------


def copy_trained_model(**overrides) -> Transformer:
    """A tiny model trained 300 steps on the copy task: peaky, realistic distributions
    (150 left the seed-shifted audit variants unsure of most sentences: tests/variants).

    Trained once per set of overrides; each call gets its own copy.
    """
    return copy.deepcopy(_trained(tuple(sorted(overrides.items()))))


@functools.cache
def _trained(overrides: tuple) -> Transformer:
    overrides = dict(overrides)
    torch.manual_seed(0)
    cfg = ModelConfig.tiny(vocab_size=16, d_model=32, d_ff=64, dropout=0.0, **overrides)
    model = Transformer(cfg)
    optimizer = build_optimizer(model, TrainConfig(max_steps=1, warmup=1))
    for g in optimizer.param_groups:
        g["lr"] = 3e-3
    for _ in range(300):
        src = torch.randint(3, 16, (32, 7))
        src[:, -1] = EOS
        tgt_in = torch.cat([torch.ones(32, 1, dtype=torch.long), src[:, :-1]], dim=1)
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), src.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def sources(vocab: int, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (5, 8), generator=generator)
    src[:, -1] = EOS
    src[1, 5:] = PAD
    src[3, 3:] = PAD
    src[1, 4] = src[3, 2] = EOS
    return src


def assert_same_decoding(model, frozen, src, extra_len=6):
    with torch.no_grad():
        encoded = model.encode(src)
        tgt = torch.randint(3, model.cfg.vocab_size, (src.size(0), 6))
        torch.testing.assert_close(
            frozen.decode(tgt, frozen.encode(src)), model.decode(tgt, encoded), rtol=0, atol=1e-5
        )
    for search in (
        lambda m: greedy_search(m, src, extra_len=extra_len),
        lambda m: beam_search(m, src, beam=4, nbest=4, extra_len=extra_len),
    ):
        expected, got = search(model), search(frozen)
        assert [[h.tokens for h in r] for r in got] == [[h.tokens for h in r] for r in expected]
        assert [h.score for r in got for h in r] == pytest.approx(
            [h.score for r in expected for h in r], abs=1e-4
        )


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"norm_first": True, "n_kv_heads": 2},
        {"positional": "rotary"},
        {"positional": "relative"},
        {"positional": "alibi", "activation": "gelu"},
        {"positional": "learned", "tie_output": False, "output_bias": True},
    ],
)
def test_frozen_model_equals_the_trained_literal_one(overrides):
    model = copy_trained_model(**overrides)
    frozen = freeze(model)
    assert_same_decoding(model, frozen, sources(16))


@pytest.mark.parametrize("shape", list(SHAPES)[:2])
def test_frozen_marian_model_equals_the_literal_one(shape, tmp_path):
    build_marian_directory(tmp_path, SHAPES[shape])
    model = load_marian_model(tmp_path).eval()
    assert_same_decoding(model, freeze(model), sources(model.cfg.vocab_size))


def test_frozen_model_holds_no_link_to_the_training_parameters():
    model = copy_trained_model()
    frozen = freeze(model)
    trained = {p.data_ptr() for p in model.parameters()}
    held = [t for t in (*frozen.parameters(), *frozen.buffers()) if t.data_ptr() in trained]
    assert held == [] and not any(p.requires_grad for p in frozen.parameters())
    src, tgt = sources(16), torch.randint(3, 16, (5, 4))
    with torch.no_grad():
        before = frozen(src, tgt)
    model.train()
    optimizer = build_optimizer(model, TrainConfig(max_steps=1, warmup=1))  # fused Adam
    model(src, tgt).sum().backward()
    optimizer.step()
    with torch.no_grad():
        torch.testing.assert_close(frozen(src, tgt), before, rtol=0, atol=0)
        assert not torch.allclose(model.eval()(src, tgt), before)


def test_freezing_to_bf16_keeps_the_outputs_close():
    model = copy_trained_model()
    frozen = freeze(model, dtype=torch.bfloat16)
    assert frozen.decoder.embedding.tokens.weight.dtype == torch.bfloat16
    src = sources(16)
    expected = greedy_search(model, src, extra_len=6)
    got = greedy_search(frozen, src, extra_len=6)
    agree = sum(a[0].tokens == b[0].tokens for a, b in zip(expected, got, strict=True))
    assert agree >= 4  # a trained copy model is confident: bf16 rounding rarely flips a token


def test_freezing_keeps_a_head_mask():
    model = copy_trained_model()
    model.decoder.layers[0].cross_attn.head_mask = torch.tensor([1.0, 0.0, 1.0, 1.0])
    model.encoder.layers[1].self_attn.head_mask = torch.tensor([0.0, 1.0, 0.5, 1.0])
    assert_same_decoding(model, freeze(model), sources(16))
