"""Linear attention (Katharopoulos et al. 2020), added as one kernel module and this test:
against a naive O(T^2) reference of its own definition, padding, cached decoding as a
recurrent state against the whole pass, frozen against literal, and beam search."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aiayn import ModelConfig, build_model, freeze
from aiayn.inference.decoding import new_cache
from aiayn.inference.search import beam_search
from aiayn.models.encoder_decoder import normal_initialisation
from aiayn.nn.kernels import KERNELS, build_kernel
from aiayn.nn.kernels import linear as linear_module
from aiayn.nn.kernels.linear import LinearAttentionKernel, LinearAttentionState

KERNEL = LinearAttentionKernel()


def naive(q, k, v, key_mask=None, causal=False):
    """The definition, one query at a time: weights phi(q_i).phi(k_j) over the allowed j."""
    phi = lambda x: F.elu(x) + 1  # noqa: E731
    heads = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(heads, dim=1), v.repeat_interleave(heads, dim=1)
    batch, n_heads, t_len, _ = q.shape
    s_len = k.size(2)
    out = torch.zeros(batch, n_heads, t_len, v.size(-1), dtype=q.dtype)
    for b in range(batch):
        for h in range(n_heads):
            for i in range(t_len):
                allowed = [
                    j
                    for j in range(s_len)
                    if (key_mask is None or key_mask[b, j])
                    and (not causal or j <= s_len - t_len + i)
                ]
                if not allowed:
                    continue  # no key: a zero output
                scores = torch.stack([phi(q[b, h, i]) @ phi(k[b, h, j]) for j in allowed])
                weights = scores / scores.sum()
                out[b, h, i] = sum(w * v[b, h, j] for w, j in zip(weights, allowed, strict=True))
    return out


def qkv(batch=2, heads=4, kv_heads=2, t_len=5, s_len=5, dk=6, dv=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads, t_len, dk), (batch, kv_heads, s_len, dk), (batch, kv_heads, s_len, dv)]
    return [torch.randn(*s, generator=generator, dtype=torch.float64) for s in shapes]


@pytest.mark.parametrize(
    ("causal", "t_len", "chunk"),
    [(False, 5, 64), (True, 5, 64), (True, 5, 2), (True, 2, 64)],  # 2 chunks; last 2 of 5
)
def test_values_and_gradients_equal_the_definition(causal, t_len, chunk, monkeypatch):
    monkeypatch.setattr(linear_module, "CHUNK", chunk)
    q, k, v = qkv(t_len=t_len)
    for x in (q, k, v):
        x.requires_grad_(True)
    out, _ = KERNEL(q, k, v, causal=causal)
    expected = naive(q, k, v, causal=causal)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_padded_keys_count_for_nothing_and_a_row_without_keys_is_zero():
    q, k, v = qkv()
    real = torch.tensor([[True, True, True, False, False], [False] * 5])
    out, _ = KERNEL(q, k, v, mask=real[:, None, None, :])
    torch.testing.assert_close(out, naive(q, k, v, key_mask=real))
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # no key at all: zeros, not NaN
    changed = k.clone()
    changed[0, :, 3:] = 100.0  # what a padded key holds does not matter
    torch.testing.assert_close(KERNEL(q, changed, v, mask=real[:, None, None, :])[0][0], out[0])


def test_the_weights_are_the_normalised_feature_products():
    q, k, v = qkv(kv_heads=4)
    out, weights = KERNEL(q, k, v, causal=True, need_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5, dtype=torch.float64))
    assert torch.all(weights.triu(diagonal=1) == 0)  # causal
    torch.testing.assert_close(weights @ v, out)


def test_a_bias_or_attention_dropout_is_refused():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="no score bias"):
        KERNEL(q, k, v, bias=torch.zeros(4, 5, 5))
    with pytest.raises(ValueError, match="attention_dropout"):
        KERNEL(q, k, v, dropout_p=0.1)


def test_the_state_sums_the_prefix_and_its_size_does_not_grow():
    q, k, v = qkv(t_len=7, s_len=7)
    state = LinearAttentionState()
    steps = [KERNEL.attend_cached(q[:, :, :3], k[:, :, :3], v[:, :, :3], state, causal=True)[0]]
    sizes = {(state.sums.shape, state.normaliser.shape)}
    for t in range(3, 7):
        sl = slice(t, t + 1)
        steps.append(KERNEL.attend_cached(q[:, :, sl], k[:, :, sl], v[:, :, sl], state)[0])
        sizes.add((state.sums.shape, state.normaliser.shape))
    torch.testing.assert_close(torch.cat(steps, dim=2), KERNEL(q, k, v, causal=True)[0])
    assert state.length == 7 and len(sizes) == 1  # (B, Hkv, Dk, Dv) and (B, Hkv, Dk) throughout


def small(architecture: str, **overrides):
    preset = ModelConfig.gpt if architecture == "decoder_only" else ModelConfig.tiny
    settings = dict(d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2, max_len=32)
    cfg = preset(40, **{**settings, "dropout": 0.0, "attention": "linear", **overrides})
    model = build_model(cfg).eval()
    normal_initialisation(model, std=0.3)  # varied outputs
    return model


@pytest.mark.parametrize("positional", ["learned", "rotary"])
def test_a_decoder_only_model_decodes_with_the_state_as_in_one_pass(positional):
    model = small("decoder_only", positional=positional)
    ids = torch.randint(3, 40, (3, 9))
    with torch.no_grad():
        whole = model(ids)
        cache = new_cache(model)
        parts = [model(ids[:, :4], cache)] + [model(ids[:, t : t + 1], cache) for t in range(4, 9)]
    assert all(isinstance(store, LinearAttentionState) for store in cache.self_attention)
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=0)


@pytest.mark.parametrize("architecture", ["decoder_only", "encoder_decoder"])
def test_frozen_equals_literal_and_beam_search_agrees(architecture):
    model = small(architecture)
    src = torch.randint(3, 40, (3, 6))
    src[0, 4:] = model.cfg.pad_id  # a padded source / prompt row
    if architecture == "decoder_only":
        src = src[:, :4]  # prompts are unpadded
    frozen = freeze(model)
    with torch.no_grad():
        literal = beam_search(model, src, beam=3, extra_len=None, max_output_len=6)
        fast = beam_search(frozen, src, beam=3, extra_len=None, max_output_len=6)
    assert [[h.tokens for h in hyps] for hyps in fast] == [
        [h.tokens for h in hyps] for hyps in literal
    ]
    for hyps_a, hyps_b in zip(fast, literal, strict=True):
        for a, b in zip(hyps_a, hyps_b, strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-4)
    assert len({token for hyps in literal for h in hyps for token in h.tokens}) > 3


def test_it_is_a_registered_kernel_that_refuses_a_bias_scheme():
    assert KERNELS.get("linear") is LinearAttentionKernel
    cfg = ModelConfig.tiny(40, attention="linear")
    assert isinstance(build_kernel(cfg), LinearAttentionKernel)
    with pytest.raises(ValueError, match=r"positional 'alibi'.*'linear'"):
        build_model(ModelConfig.tiny(40, attention="linear", positional="alibi"))
