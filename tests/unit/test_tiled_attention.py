import math

import pytest
import torch
import torch.nn.functional as F

from aiayn.nn.masks import causal_mask
from aiayn.nn.tiled_attention import (
    Traffic,
    block_sizes,
    standard_attention,
    tiled_attention,
    tiled_attention_backward,
    tiled_attention_forward,
)

# (N queries, S keys, causal, Br, Bc): odd lengths, blocks that do not divide them,
# one block larger than the sequence, Br != Bc, fewer queries than keys (a cache).
CASES = [
    (37, 37, False, 8, 16),
    (37, 37, True, 8, 16),
    (37, 37, True, 16, 5),
    (33, 33, True, 1, 1),
    (13, 29, False, 4, 6),
    (13, 29, True, 4, 6),
    (13, 29, True, 64, 64),
    (1, 9, True, 3, 2),
]


def random_qkv(n_queries, n_keys, d=16, dv=8, seed=0, requires_grad=False):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(2, 3, n_queries, d), (2, 3, n_keys, d), (2, 3, n_keys, dv)]
    return [torch.randn(s, generator=generator).requires_grad_(requires_grad) for s in shapes]


def sdpa(q, k, v, causal):
    """PyTorch's SDPA, its causal mask aligned to the end (the queries are the last N)."""
    mask = causal_mask(q.size(-2), k.size(-2)) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize(("n_queries", "n_keys", "causal", "block_rows", "block_cols"), CASES)
def test_the_tiled_forward_equals_sdpa_and_its_logsumexp_the_scores(
    n_queries, n_keys, causal, block_rows, block_cols
):
    q, k, v = random_qkv(n_queries, n_keys)
    out, lse = tiled_attention_forward(q, k, v, causal, block_rows, block_cols)
    torch.testing.assert_close(out, sdpa(q, k, v, causal), rtol=1e-5, atol=1e-5)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        scores = scores.masked_fill(~causal_mask(n_queries, n_keys), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("n_queries", "n_keys", "causal", "block_rows", "block_cols"), CASES)
def test_the_tiled_backward_equals_autograd_through_the_explicit_formula(
    n_queries, n_keys, causal, block_rows, block_cols
):
    q, k, v = random_qkv(n_queries, n_keys, requires_grad=True)
    grad_out = torch.randn(2, 3, n_queries, v.size(-1), generator=torch.Generator().manual_seed(1))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        scores = scores.masked_fill(~causal_mask(n_queries, n_keys), float("-inf"))
    expected = torch.autograd.grad(scores.softmax(dim=-1) @ v, (q, k, v), grad_out)
    out = tiled_attention(q, k, v, causal, block_rows, block_cols)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    for name, mine, theirs in zip("qkv", got, expected, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5, msg=f"d{name}")


def test_the_backward_keeps_no_n_by_n_tensor_for_autograd():
    q, k, v = random_qkv(64, 64, d=8, dv=8, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.shape) or t, lambda t: t
    ):
        out = tiled_attention(q, k, v, causal=True, block_rows=8, block_cols=8)
    assert sorted(saved) == sorted([q.shape, k.shape, v.shape, out.shape, q.shape[:-1]])
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.shape) or t, lambda t: t
    ):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)  # the math path keeps (N, N)
        (q @ k.transpose(-2, -1)).softmax(-1) @ v
    assert (2, 3, 64, 64) in saved


@pytest.mark.parametrize("causal", [False, True])
def test_standard_attention_equals_sdpa(causal):
    q, k, v = random_qkv(13, 29)
    torch.testing.assert_close(
        standard_attention(q, k, v, causal), sdpa(q, k, v, causal), rtol=1e-5, atol=1e-5
    )


# Hand counts, B = H = 1, N = S = 4, d = dv = 2, Br = Bc = 2, float32 (4 bytes an element).
# Standard (Algorithm 0): read Q, K (8 + 8), S (16), P (16), V (8); write S, P (16 + 16), O (8).
# Tiled (Algorithm 1): write O, l, m at the start (8 + 4 + 4); per key block read K_j, V_j
# (4 + 4); per visited block pair read Q_i, O_i, l_i, m_i (4 + 4 + 2 + 2) and write O_i, l_i,
# m_i (4 + 2 + 2); at the end read l, m (4 + 4) and write L (4). Causal skips pair (0, 1).
# Backward: read dO, O (8 + 8), write D (4) and dQ = 0 (8); per key block read K_j, V_j (8)
# and write dK_j, dV_j (8); per pair read Q_i, dO_i, L_i, D_i, dQ_i (4 + 4 + 2 + 2 + 4) and
# write dQ_i (4).
@pytest.mark.parametrize(
    ("algorithm", "causal", "elements_read", "elements_written"),
    [
        ("standard", False, 8 + 8 + 16 + 16 + 8, 16 + 16 + 8),
        ("tiled", False, 2 * 8 + 4 * 12 + 8, 16 + 4 * 8 + 4),
        ("tiled", True, 2 * 8 + 3 * 12 + 8, 16 + 3 * 8 + 4),
        ("backward", False, 16 + 2 * 8 + 4 * 16, 4 + 8 + 2 * 8 + 4 * 4),
        ("backward", True, 16 + 2 * 8 + 3 * 16, 4 + 8 + 2 * 8 + 3 * 4),
    ],
)
def test_the_byte_counts_equal_a_hand_count(algorithm, causal, elements_read, elements_written):
    q, k, v = random_qkv(4, 4, d=2, dv=2)
    q, k, v = q[:1, :1], k[:1, :1], v[:1, :1]  # (1, 1, 4, 2)
    traffic = Traffic()
    if algorithm == "standard":
        standard_attention(q, k, v, causal, traffic)
    elif algorithm == "tiled":
        tiled_attention_forward(q, k, v, causal, 2, 2, traffic)
    else:
        out, lse = tiled_attention_forward(q, k, v, causal, 2, 2)
        tiled_attention_backward(q, k, v, out, lse, torch.ones_like(out), causal, 2, 2, traffic)
    assert (traffic.read, traffic.written) == (4 * elements_read, 4 * elements_written)
    assert traffic.total == 4 * (elements_read + elements_written)


def test_the_tiled_traffic_grows_as_n_squared_d_squared_over_m():
    """Algorithm 1 reads K, V once and Q, O, l, m once per key block: for N a multiple of Bc,
    2Nd + (N / Bc)(3Nd + 4N) + (Nd + 2N) + 3N elements, about 12 N^2 d^2 / M."""
    d, n = 8, 96
    q, k, v = random_qkv(n, n, d=d, dv=d)
    q, k, v = q[:1, :1], k[:1, :1], v[:1, :1]
    for sram in (128, 384):
        block_rows, block_cols = block_sizes(sram, d)
        traffic = Traffic()
        tiled_attention_forward(q, k, v, False, block_rows, block_cols, traffic)
        columns = n // block_cols
        elements = 2 * n * d + columns * (3 * n * d + 4 * n) + (n * d + 2 * n) + 3 * n
        assert traffic.total == 4 * elements


def test_block_sizes_are_the_paper_s():
    assert block_sizes(4 * 64 * 96, 64) == (64, 96)  # Bc = M / 4d = 96, Br = min(96, d)
    assert block_sizes(4 * 64 * 16 + 1, 64) == (17, 17)  # ceil(M / 4d) = 17 < d
    with pytest.raises(ValueError, match=r"at least 4 \* d"):
        block_sizes(100, 64)


def test_bad_arguments_are_refused_with_their_values():
    q, k, v = random_qkv(5, 3)
    with pytest.raises(ValueError, match="N <= S"):
        tiled_attention_forward(q, k, v, causal=True)
    with pytest.raises(ValueError, match="Br=0"):
        tiled_attention_forward(q, k, v, block_rows=0)
