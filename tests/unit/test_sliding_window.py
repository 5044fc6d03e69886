import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from aiayn.nn.kernels import sliding_window
from aiayn.nn.kernels.sliding_window import band_mask, sliding_window_attention

# (T, S, window): lengths that are and are not multiples of the window, windows
# smaller than, equal to and larger than the length, and T < S (cached decoding).
SHAPES = [
    (13, 13, 4),
    (16, 16, 4),
    (12, 12, 1),
    (10, 10, 10),
    (9, 9, 20),
    (5, 17, 3),
    (1, 17, 4),
    (6, 8, 2),
    (7, 30, 5),
]
GRID = list(itertools.product(SHAPES, [False, True], [0, 3]))


def brute_force_band(q_len, k_len, window, causal, n_global):
    """The rule of `band_mask`'s docstring, one (query, key) pair at a time."""
    allowed = torch.zeros(q_len, k_len, dtype=torch.bool)
    for i, j in itertools.product(range(q_len), range(k_len)):
        p = k_len - q_len + i
        local = 0 <= p - j <= window if causal else abs(p - j) <= window
        is_global = (j < n_global or p < n_global) and (not causal or j <= p)
        allowed[i, j] = local or is_global
    return allowed


def dense_reference(q, k, v, window, causal, key_mask, n_global):
    """PyTorch's SDPA over the equivalent dense mask; rows with no key give zeros."""
    allowed = band_mask(q.size(2), k.size(2), window, causal, n_global) & key_mask[:, None, None]
    has_key = allowed.any(dim=-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~has_key, enable_gqa=True)
    return out.masked_fill(~has_key, 0.0)


def random_inputs(t_len, s_len, dtype, batch=2, heads=4, kv_heads=2, d_k=8, d_v=6):
    """GQA (4 query heads on 2 key/value heads), Dk != Dv, about a third of keys padded."""
    q = torch.randn(batch, heads, t_len, d_k, dtype=dtype)
    k = torch.randn(batch, kv_heads, s_len, d_k, dtype=dtype)
    v = torch.randn(batch, kv_heads, s_len, d_v, dtype=dtype)
    key_mask = torch.rand(batch, s_len) > 0.3
    return q, k, v, key_mask


@pytest.mark.parametrize(("shape", "causal", "n_global"), GRID)
def test_band_mask_follows_the_rule(shape, causal, n_global):
    t_len, s_len, window = shape
    expected = brute_force_band(t_len, s_len, window, causal, n_global)
    assert torch.equal(band_mask(t_len, s_len, window, causal, n_global), expected)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize(("shape", "causal", "n_global"), GRID)
def test_equals_dense_attention_with_the_band_mask(shape, causal, n_global, dtype, tolerance):
    q, k, v, key_mask = random_inputs(shape[0], shape[1], dtype)
    out = sliding_window_attention(q, k, v, shape[2], causal, key_mask, n_global)
    expected = dense_reference(q, k, v, shape[2], causal, key_mask, n_global)
    torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("shape", "causal", "n_global"), GRID)
def test_gradients_equal_the_dense_reference(shape, causal, n_global):
    q, k, v, key_mask = random_inputs(shape[0], shape[1], torch.float64)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    upstream = torch.randn(q.size(0), q.size(1), q.size(2), v.size(-1), dtype=torch.float64)
    grads = []
    for fn in (sliding_window_attention, dense_reference):
        out = fn(q, k, v, shape[2], causal, key_mask, n_global)
        grads.append(torch.autograd.grad(out, (q, k, v), upstream))
    for got, expected in zip(*grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_scoring_a_few_blocks_at_a_time_changes_nothing(causal, monkeypatch):
    q, k, v, key_mask = random_inputs(23, 23, torch.float64)
    whole = sliding_window_attention(q, k, v, 3, causal, key_mask, n_global=2)
    monkeypatch.setattr(sliding_window, "ELEMENTS_PER_CHUNK", 1)  # one block per chunk
    chunked = sliding_window_attention(q, k, v, 3, causal, key_mask, n_global=2)
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)


def test_bfloat16_is_close_to_the_float32_reference():
    q, k, v, key_mask = random_inputs(40, 40, torch.float32)
    expected = dense_reference(q, k, v, 6, True, key_mask, 2)
    out = sliding_window_attention(
        q.bfloat16(), k.bfloat16(), v.bfloat16(), 6, True, key_mask, n_global=2
    )
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=0.02, atol=0.02)


@pytest.mark.parametrize("causal", [False, True])
def test_queries_with_no_key_give_zeros_not_nan(causal):
    q, k, v, _ = random_inputs(12, 12, torch.float32)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    key_mask = torch.ones(2, 12, dtype=torch.bool)
    key_mask[0] = False  # a fully padded sentence
    key_mask[1, :8] = False  # causal: queries 0..5 see no key within 2 before them
    out = sliding_window_attention(q, k, v, 2, causal, key_mask)
    assert torch.all(out[0] == 0)
    if causal:
        assert torch.all(out[1, :, :8] == 0)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("n_global", [0, 3])
def test_cached_decoding_equals_the_full_sequence(n_global):
    q, k, v, key_mask = random_inputs(20, 20, torch.float32)
    full = sliding_window_attention(q, k, v, 4, True, key_mask, n_global)
    for t_len in (1, 5):
        step = sliding_window_attention(q[:, :, -t_len:], k, v, 4, True, key_mask, n_global)
        torch.testing.assert_close(step, full[:, :, -t_len:], rtol=1e-6, atol=1e-6)


def test_dropout_keeps_the_expected_output():
    # With values all one, each row's output is the sum of its dropped-out, rescaled
    # weights: 1 in expectation.
    q, k, _, key_mask = random_inputs(16, 16, torch.float32)
    v = torch.ones(2, 2, 16, 6)
    key_mask[:, 0] = True  # the global key: no row without a key
    outs = torch.stack(
        [
            sliding_window_attention(q, k, v, 3, False, key_mask, 1, dropout_p=0.3)
            for _ in range(200)
        ]
    )
    assert not torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs.mean(), torch.tensor(1.0), rtol=0.01, atol=0.01)


def peak_allocated_bytes(fn) -> int:
    """Largest live total of the CPU allocations `fn` makes (profiler memory events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start
    )
    live, peak = 0, 0
    for event in events:
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def test_memory_grows_linearly_with_length():
    window, n_global, d_head = 32, 4, 16
    peaks = {}
    for length in (1024, 4096):
        q, k, v = (torch.randn(1, 2, length, d_head) for _ in range(3))
        key_mask = torch.ones(1, length, dtype=torch.bool)

        def call(q=q, k=k, v=v, key_mask=key_mask):
            with torch.inference_mode():
                sliding_window_attention(q, k, v, window, False, key_mask, n_global)

        peaks[length] = peak_allocated_bytes(call)
    dense_scores = 2 * 4096 * 4096 * 4  # (H, T, S) float32 scores at T = 4096
    assert peaks[4096] < dense_scores / 6
    assert peaks[4096] < 6 * peaks[1024]  # 4x the length: about 4x the memory, not 16x


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(window=0), "window must be >= 1"),
        (dict(t_len=9), "T=9 > S=8"),
        (dict(n_global=-1), "n_global must be >= 0, got -1"),
        (dict(kv_heads=3), r"query heads \(4\) must be a multiple of key/value heads \(3\)"),
        (dict(key_mask=torch.ones(2, 7, dtype=torch.bool)), r"got \(2, 7\)"),
        (dict(dropout_p=1.0), r"dropout_p must be in \[0, 1\), got 1.0"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, message):
    args = dict(t_len=8, window=2, n_global=0, kv_heads=2, key_mask=None, dropout_p=0.0) | kwargs
    q = torch.randn(2, 4, args["t_len"], 8)
    k = torch.randn(2, args["kv_heads"], 8, 8)
    v = torch.randn(2, args["kv_heads"], 8, 8)
    with pytest.raises(ValueError, match=message):
        sliding_window_attention(
            q,
            k,
            v,
            args["window"],
            key_mask=args["key_mask"],
            n_global=args["n_global"],
            dropout_p=args["dropout_p"],
        )


def test_band_mask_refuses_bad_arguments():
    with pytest.raises(ValueError, match="window must be >= 1"):
        band_mask(4, 4, 0)
    with pytest.raises(ValueError, match="T=5 > S=4"):
        band_mask(5, 4, 2)
