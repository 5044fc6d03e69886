"""Performer attention (FAVOR+), one kernel module and this test: against a naive O(T^2)
reference of its own definition (values, gradients, padding), the chunked causal form and
the cached decoding state against the whole pass, the estimate converging to softmax
attention as features grow, the random directions saved with the model, redrawing, and
its options refused by name."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from test_linear_attention import qkv  # random float64 q, k, v with grouped heads
from torch.profiler import ProfilerActivity, profile

from aiayn import ModelConfig, build_model
from aiayn.inference.decoding import new_cache
from aiayn.io.checkpoint import load_model, save_model
from aiayn.models.encoder_decoder import normal_initialisation
from aiayn.nn.kernels import KERNELS, build_kernel
from aiayn.nn.kernels import linear as linear_module  # CHUNK: causal_sums, shared
from aiayn.nn.kernels.performer import PerformerKernel, PerformerState


def kernel(d_k=6, num_features=16, redraw_interval=None, seed=0):
    torch.manual_seed(seed)
    return PerformerKernel(d_k, num_features, redraw_interval).double()


def naive(kernel, q, k, v, key_mask=None, causal=False):
    """The definition, one query at a time: weights phi(q_i).phi(k_j) over the allowed j,
    phi(x) = exp(w . x' - |x'|^2 / 2) / sqrt(m), x' = x / Dk^(1/4), w the kernel's rows."""
    w = kernel.projection
    d_k, m = w.size(1), w.size(0)

    def phi(x):
        x = x / d_k**0.25
        return torch.exp(w @ x - x @ x / 2) / math.sqrt(m)

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


@pytest.mark.parametrize(
    ("causal", "t_len", "chunk"),
    [(False, 5, 64), (True, 5, 64), (True, 5, 2), (True, 2, 64)],  # 2 chunks; last 2 of 5
)
def test_values_and_gradients_equal_the_definition(causal, t_len, chunk, monkeypatch):
    monkeypatch.setattr(linear_module, "CHUNK", chunk)
    attention = kernel()
    q, k, v = qkv(t_len=t_len)
    for x in (q, k, v):
        x.requires_grad_(True)
    out, _ = attention(q, k, v, causal=causal)
    expected = naive(attention, q, k, v, causal=causal)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("causal", [False, True])
def test_padded_keys_count_for_nothing_and_a_row_without_keys_is_zero(causal):
    attention = kernel()
    q, k, v = qkv()
    real = torch.tensor([[True, True, True, False, False], [False] * 5])
    out, _ = attention(q, k, v, mask=real[:, None, None, :], causal=causal)
    torch.testing.assert_close(out, naive(attention, q, k, v, key_mask=real, causal=causal))
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # no key at all: zeros, not NaN
    changed = k.clone()
    changed[0, :, 3:] = 100.0  # what a padded key holds does not matter (nor overflows)
    again, _ = attention(q, changed, v, mask=real[:, None, None, :], causal=causal)
    torch.testing.assert_close(again[0], out[0])


def test_large_scores_neither_overflow_nor_underflow_in_float32():
    attention = kernel()
    q, k, v = (10 * x for x in qkv())  # exp(-|k'|^2 / 2) alone is 0 in float32
    out, _ = copy.deepcopy(attention).float()(q.float(), k.float(), v.float())
    expected = naive(attention, q, k, v)  # float64 holds exp(-250)
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)


def test_the_weights_are_the_normalised_feature_products():
    attention = kernel()
    q, k, v = qkv(kv_heads=4)
    out, weights = attention(q, k, v, causal=True, need_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5, dtype=torch.float64))
    assert torch.all(weights.triu(diagonal=1) == 0)  # causal
    torch.testing.assert_close(weights @ v, out)


def test_the_state_sums_the_prefix_and_its_size_does_not_grow(monkeypatch):
    monkeypatch.setattr(linear_module, "CHUNK", 2)
    attention = kernel()
    q, k, v = qkv(t_len=7, s_len=7)
    k[:, :, 5] *= 4  # a later key with a larger feature: the state is rescaled
    state = PerformerState()
    steps = [attention.attend_cached(q[:, :, :3], k[:, :, :3], v[:, :, :3], state)[0]]
    sizes = {state.sums.shape}
    for t in range(3, 7):
        sl = slice(t, t + 1)
        steps.append(attention.attend_cached(q[:, :, sl], k[:, :, sl], v[:, :, sl], state)[0])
        sizes.add(state.sums.shape)
    torch.testing.assert_close(torch.cat(steps, dim=2), attention(q, k, v, causal=True)[0])
    assert state.length == 7 and sizes == {(2, 4, 16, 3)}  # (B, H, m, Dv) throughout


def test_the_causal_form_allocates_neither_t_squared_nor_t_m_dv():
    """Chunks keep memory at about T (C + m Dv / C): no (T, T) scores, and no per-position
    prefix sums of (m, Dv) (linear attention's T Dk Dv form would be 8 MiB here)."""
    t_len, m, d_v = 2048, 64, 16
    attention = PerformerKernel(8, m, None)
    q, k, v = (x[:1, :1].float() for x in qkv(t_len=t_len, s_len=t_len, kv_heads=4, dk=8, dv=d_v))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        attention(q, k, v, causal=True)
    largest = max(event.cpu_memory_usage for event in prof.events())
    assert 0 < largest < min(t_len * t_len, t_len * m * d_v) * 4 // 8


def test_the_estimate_converges_to_softmax_attention_as_features_grow():
    """FAVOR+ is unbiased for exp(q . k / sqrt(Dk)): the error of the attention output
    falls as m grows (about as 1 / sqrt(m)). Fixed seeds; the stated tolerances: mean
    absolute error below 0.05 with 4,096 features, and at least 4x smaller than with 16."""
    q, k, v = qkv(batch=1, heads=2, kv_heads=2, t_len=32, s_len=32, dk=16, dv=8, seed=1)
    q, k = q / 2, k / 2  # moderate scores, as after training's layer norms
    exact = torch.softmax(q @ k.transpose(-2, -1) / 4, dim=-1) @ v
    errors = {}
    for m in (16, 256, 4096):
        runs = [
            (kernel(16, m, seed=seed)(q, k, v)[0] - exact).abs().mean().item() for seed in range(3)
        ]
        errors[m] = sum(runs) / len(runs)
    assert errors[4096] < 0.02
    assert errors[16] > 4 * errors[4096]
    assert errors[16] > errors[256] > errors[4096]


def test_the_directions_are_orthogonal_within_a_block():
    rows = kernel(d_k=8, num_features=20).projection  # blocks of 8, 8, 4 rows
    for block in (rows[:8], rows[8:16], rows[16:]):
        unit = block / block.norm(dim=1, keepdim=True)
        eye = torch.eye(len(block), dtype=unit.dtype)
        torch.testing.assert_close(unit @ unit.T, eye, atol=1e-6, rtol=0)


def test_directions_are_redrawn_in_training_only_every_interval():
    attention = kernel(redraw_interval=2)
    q, k, v = qkv(kv_heads=4)
    first = attention.projection
    attention(q, k, v)
    assert attention.projection is first  # call 1
    attention(q, k, v)
    assert not torch.equal(attention.projection, first)  # call 2: redrawn
    attention.eval()
    second = attention.projection
    for _ in range(3):
        attention(q, k, v)
    assert attention.projection is second and int(attention.calls) == 2


def test_a_redraw_follows_the_layers_seed_and_calls_not_the_random_state():
    # two processes of a distributed run: the same model, different random states
    first, second = kernel(redraw_interval=1), kernel(redraw_interval=1)
    q, k, v = qkv(kv_heads=4)
    torch.manual_seed(1)
    first(q, k, v)
    torch.manual_seed(2)
    second(q, k, v)
    assert torch.equal(first.projection, second.projection)
    assert not torch.equal(first.projection, kernel().projection)  # redrawn all the same


def small(**options):
    cfg = ModelConfig.gpt(
        40, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2, max_len=32,
        dropout=0.0, attention="performer", attention_options=options,
    )  # fmt: skip
    model = build_model(cfg).eval()
    normal_initialisation(model, std=0.3)
    return model


def test_a_model_decodes_with_the_state_as_in_one_pass_and_reloads_the_same(tmp_path):
    model = small(num_features=32)
    ids = torch.randint(3, 40, (3, 9))
    with torch.no_grad():
        whole = model(ids)
        cache = new_cache(model)
        parts = [model(ids[:, :4], cache)] + [model(ids[:, t : t + 1], cache) for t in range(4, 9)]
    assert all(isinstance(store, PerformerState) for store in cache.self_attention)
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=0)

    assert "decoder.layers.0.self_attn.kernel.projection" in model.state_dict()
    path = save_model(model, tmp_path / "model.safetensors")
    loaded = load_model(path).eval()  # built with new random directions, then the saved ones
    saved = model.decoder.layers[0].self_attn.kernel.projection
    assert not torch.equal(small(num_features=32).decoder.layers[0].self_attn.kernel.projection,
                           saved)  # fmt: skip
    assert torch.equal(loaded.decoder.layers[0].self_attn.kernel.projection, saved)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), whole)


def test_it_is_registered_and_refuses_bad_options_by_name():
    assert KERNELS.get("performer") is PerformerKernel
    cfg = ModelConfig.tiny(40, attention="performer", attention_options={"num_features": 8})
    assert build_kernel(cfg).projection.shape == (8, cfg.d_k)
    with pytest.raises(ValueError, match="num_features must be an integer >= 1"):
        build_kernel(ModelConfig.tiny(40, attention="performer",
                                      attention_options={"num_features": 0}))  # fmt: skip
    with pytest.raises(ValueError, match="redraw_interval"):
        build_kernel(ModelConfig.tiny(40, attention="performer",
                                      attention_options={"redraw_interval": -1}))  # fmt: skip
    with pytest.raises(ValueError, match=r"takes no option 'window'.*num_features"):
        build_kernel(ModelConfig.tiny(40, attention="performer",
                                      attention_options={"window": 3}))  # fmt: skip
    with pytest.raises(ValueError, match="no score bias"):
        kernel()(*qkv(), bias=torch.zeros(4, 5, 5))
    with pytest.raises(ValueError, match="attention_dropout"):
        kernel()(*qkv(), dropout_p=0.1)


def test_a_module_kernel_assigned_later_replaces_the_old_one_and_is_saved():
    """`attn.kernel = X` takes effect for a module kernel too, and its buffers are the
    attention module's (its state dict); a plain kernel after it leaves none behind."""
    from aiayn.nn.attention import MultiHeadAttention
    from aiayn.nn.kernels.performer import PerformerKernel
    from aiayn.nn.kernels.sdpa import SdpaKernel

    attention = MultiHeadAttention(16, 2, dropout=0.0)
    performer = PerformerKernel(d_k=8, num_features=4)
    attention.kernel = performer
    assert attention.kernel is performer
    assert any(key.startswith("kernel.") for key in attention.state_dict())
    assert not any(key.startswith("_kernel") for key in attention.state_dict())
    attention.kernel = SdpaKernel()
    assert isinstance(attention.kernel, SdpaKernel)
    assert not any(key.startswith("kernel.") for key in attention.state_dict())
