"""FlashAttention's tiling by hand: Dao et al. (2022), Algorithm 1, and its backward.

A teaching implementation for tutorial 12 ("FlashAttention by hand"), not a kernel:
the blocks are Python loops over slices of ordinary tensors, so it is slow, and it is
not registered with `aiayn.nn.kernels`. What it shows is what a fused kernel does:

- `standard_attention`: the paper's Algorithm 0. S = QK^T and P = softmax(S) are
  written to slow memory (HBM) and read back, Theta(Nd + N^2) bytes moved.
- `tiled_attention_forward`: Algorithm 1. Blocks of K, V (outer loop) and Q (inner
  loop) are loaded into fast on-chip memory (SRAM) and the softmax is computed online
  (a running max m and sum l per row), so no N x N matrix is ever stored; O, l and m
  are read and written once per key block: Theta(N^2 d^2 / M) bytes for an SRAM of M
  elements, with the paper's block sizes (`block_sizes`). It also returns the logsumexp L = m + log l of each row.
- `tiled_attention_backward`: the gradients by recomputation (the paper's Algorithm 4,
  in FlashAttention-2's form: from L rather than l and m): each block of P is rebuilt
  from Q, K and the saved L instead of being kept from the forward.
- `tiled_attention`: the two as one differentiable function.

Each of them but `tiled_attention` takes a `Traffic`, which counts the bytes the algorithm reads from and
writes to HBM as it moves them (the tensors passed in and returned live in HBM; a slice
loaded into a local variable is on chip). Work done on chip is free in this count.

Deviations from the paper: the scores are scaled by 1 / sqrt(d) (Algorithm 2's tau);
with `causal`, a block in which every key follows every query is skipped; no dropout.

Shape legend:
    B batch, H heads, N query length, S key/value length, d query/key head size,
    dv value head size, Br / Bc the row (query) / column (key) block sizes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.nn.masks import causal_mask

__all__ = [
    "Traffic", "block_sizes", "standard_attention", "tiled_attention",
    "tiled_attention_backward", "tiled_attention_forward",
]  # fmt: skip


@dataclass
class Traffic:
    """Bytes read from and written to slow memory (HBM), counted as an algorithm moves them."""

    read: int = 0
    written: int = 0

    def load(self, x: Tensor) -> Tensor:
        """`x`, counted as read from HBM into fast memory."""
        self.read += x.numel() * x.element_size()
        return x

    def store(self, x: Tensor) -> Tensor:
        """`x`, counted as written from fast memory to HBM."""
        self.written += x.numel() * x.element_size()
        return x

    @property
    def total(self) -> int:
        return self.read + self.written


def block_sizes(sram_elements: int, d: int) -> tuple[int, int]:
    """Algorithm 1, line 1: Bc = ceil(M / 4d) and Br = min(ceil(M / 4d), d).

    Blocks of Q, K, V and O of these sizes (and one Br x Bc block of scores) fit in an
    on-chip memory of M elements.

    Args:
        sram_elements: M, the on-chip memory's size in elements (not bytes).
        d: the head size.

    Returns:
        (Br, Bc).

    Raises:
        ValueError: unless M >= 4d, the least memory in which one row of each block fits.
    """
    if sram_elements < 4 * d:
        raise ValueError(f"sram_elements ({sram_elements}) must be at least 4 * d ({4 * d})")
    columns = math.ceil(sram_elements / (4 * d))
    return min(columns, d), columns


def standard_attention(
    q: Tensor, k: Tensor, v: Tensor, causal: bool = False, traffic: Traffic | None = None
) -> Tensor:
    """softmax(Q K^T / sqrt(d)) V as the paper's Algorithm 0 runs it, through HBM.

    1. read Q, K; write S = Q K^T / sqrt(d). 2. read S; write P = softmax(S) (the
    causal mask applied here). 3. read P, V; write O = P V.

    Args:
        q: (B, H, N, d) queries.
        k: (B, H, S, d) keys.
        v: (B, H, S, dv) values.
        causal: forbid keys after each query, the queries being the last N of S
            positions (`aiayn.nn.masks.causal_mask`).
        traffic: counts the bytes moved, if given.

    Returns:
        (B, H, N, dv) outputs.
    """
    traffic = Traffic() if traffic is None else traffic
    n_queries, n_keys = q.size(-2), k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1))
    s = traffic.store(traffic.load(q) @ traffic.load(k).transpose(-2, -1) * scale)  # (B, H, N, S)
    s = traffic.load(s)
    if causal:
        s = s.masked_fill(~causal_mask(n_queries, n_keys, device=q.device), float("-inf"))
    p = traffic.store(torch.softmax(s, dim=-1))
    return traffic.store(traffic.load(p) @ traffic.load(v))  # (B, H, N, dv)


def _check(q: Tensor, k: Tensor, causal: bool, block_rows: int, block_cols: int) -> float:
    """The scale 1 / sqrt(d), once the arguments are checked."""
    if block_rows < 1 or block_cols < 1:
        raise ValueError(f"block sizes must be positive, got Br={block_rows}, Bc={block_cols}")
    if causal and q.size(-2) > k.size(-2):
        raise ValueError(
            f"causal attention needs N <= S (queries are the last N positions), "
            f"got N={q.size(-2)}, S={k.size(-2)}"
        )
    return 1.0 / math.sqrt(q.size(-1))


def _blocks(length: int, size: int) -> list[range]:
    return [range(start, min(start + size, length)) for start in range(0, length, size)]


def _query_blocks(
    n_queries: int, n_keys: int, cols: range, block_rows: int, causal: bool, device: torch.device
) -> Iterator[tuple[slice, Tensor | None]]:
    """For key block `cols`, each query block to visit: its rows, and the (Br, Bc) bool mask
    of the pairs the causal mask allows (None: all of them). Query i stands at position
    i + S - N; a block in which every key follows every query is not visited."""
    for rows in _blocks(n_queries, block_rows):
        allowed = None
        if causal and cols[-1] > rows[0] + n_keys - n_queries:
            query_at = torch.arange(rows.start, rows.stop, device=device)[:, None]
            allowed = (
                torch.arange(cols.start, cols.stop, device=device) <= query_at + n_keys - n_queries
            )
            if not allowed.any():
                continue
        yield slice(rows.start, rows.stop), allowed


def _scores(q_i: Tensor, k_j: Tensor, scale: float, allowed: Tensor | None) -> Tensor:
    """S_ij = Q_i K_j^T / sqrt(d), -inf where the mask forbids: (B, H, Br, Bc)."""
    s_ij = q_i @ k_j.transpose(-2, -1) * scale
    return s_ij if allowed is None else s_ij.masked_fill(~allowed, float("-inf"))


def tiled_attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool = False,
    block_rows: int = 64,
    block_cols: int = 64,
    traffic: Traffic | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d)) V by Algorithm 1: blocks and an online softmax.

    Outer loop over key/value blocks j, inner loop over query blocks i. For block (i, j):
    the scores S_ij, their row max m~, P~ = exp(S_ij - m~) and its row sum l~; the new
    running max m_new = max(m_i, m~) and sum l_new = e^(m_i - m_new) l_i + e^(m~ - m_new) l~;
    O_i rescaled to the new max and normalised by l_new. O, l and m go back to HBM after
    every block; at the end L = m + log l, the row's logsumexp, for the backward.

    Args:
        q: (B, H, N, d) queries.
        k: (B, H, S, d) keys.
        v: (B, H, S, dv) values.
        causal: forbid keys after each query, the queries being the last N of S
            positions; blocks with no allowed pair are skipped.
        block_rows: Br, queries per block (`block_sizes` gives the paper's choice).
        block_cols: Bc, keys per block.
        traffic: counts the bytes moved, if given.

    Returns:
        (B, H, N, dv) outputs and the (B, H, N) logsumexp of each row's scaled scores.

    Raises:
        ValueError: for a block size below 1, or `causal` with N > S.
    """
    scale = _check(q, k, causal, block_rows, block_cols)
    traffic = Traffic() if traffic is None else traffic
    n_queries, n_keys = q.size(-2), k.size(-2)
    # Line 2: O = 0, l = 0, m = -inf, in HBM.
    out = traffic.store(q.new_zeros(*q.shape[:-1], v.size(-1)))  # (B, H, N, dv)
    row_sum = traffic.store(q.new_zeros(q.shape[:-1]))  # l: (B, H, N)
    row_max = traffic.store(q.new_full(q.shape[:-1], float("-inf")))  # m: (B, H, N)
    for cols in _blocks(n_keys, block_cols):  # lines 5-6
        k_j = traffic.load(k[..., cols.start : cols.stop, :])  # (B, H, Bc, d)
        v_j = traffic.load(v[..., cols.start : cols.stop, :])  # (B, H, Bc, dv)
        # Lines 7-8, for the query blocks block j does not hide entirely.
        for at, allowed in _query_blocks(n_queries, n_keys, cols, block_rows, causal, q.device):
            q_i = traffic.load(q[..., at, :])  # (B, H, Br, d)
            o_i = traffic.load(out[..., at, :])  # (B, H, Br, dv)
            l_i = traffic.load(row_sum[..., at])[..., None]  # (B, H, Br, 1)
            m_i = traffic.load(row_max[..., at])[..., None]
            s_ij = _scores(q_i, k_j, scale, allowed)  # (B, H, Br, Bc), line 9
            m_block = s_ij.amax(dim=-1, keepdim=True)  # m~, line 10
            # A row with no allowed key in this block has m~ = -inf; shift it by 0 instead,
            # so that its P~ is 0, not exp(-inf + inf) = NaN.
            m_block = m_block.masked_fill(m_block == float("-inf"), 0.0)
            p_block = torch.exp(s_ij - m_block)  # P~
            l_block = p_block.sum(dim=-1, keepdim=True)  # l~
            m_new = torch.maximum(m_i, m_block)  # line 11
            alpha, beta = torch.exp(m_i - m_new), torch.exp(m_block - m_new)
            l_new = alpha * l_i + beta * l_block
            # Line 12. l_new > 0: every row may attend key 0, which the first block holds.
            o_new = (alpha * l_i * o_i + beta * (p_block @ v_j)) / l_new
            out[..., at, :] = traffic.store(o_new)
            row_sum[..., at] = traffic.store(l_new[..., 0])  # line 13
            row_max[..., at] = traffic.store(m_new[..., 0])
    lse = traffic.store(traffic.load(row_max) + torch.log(traffic.load(row_sum)))  # (B, H, N)
    return out, lse


def tiled_attention_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    causal: bool = False,
    block_rows: int = 64,
    block_cols: int = 64,
    traffic: Traffic | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of `tiled_attention_forward`'s output, by recomputation from L.

    First D = rowsum(dO * O) (equal to rowsum(dP * P)). Then, outer loop over key/value
    blocks j (their dK_j and dV_j kept on chip), inner loop over query blocks i:
    P_ij = exp(S_ij - L_i) rebuilt from Q_i, K_j and the saved logsumexp; dV_j += P_ij^T dO_i;
    dP_ij = dO_i V_j^T; dS_ij = P_ij * (dP_ij - D_i); dQ_i += dS_ij K_j / sqrt(d) (read
    and written back to HBM); dK_j += dS_ij^T Q_i / sqrt(d).

    Args:
        q, k, v, causal, block_rows, block_cols: as given to the forward.
        out: (B, H, N, dv) the forward's outputs.
        lse: (B, H, N) the forward's logsumexp.
        grad_out: (B, H, N, dv) the loss's gradient with respect to `out`.
        traffic: counts the bytes moved, if given.

    Returns:
        (dQ, dK, dV), shaped as q, k and v.

    Raises:
        ValueError: for a block size below 1, or `causal` with N > S.
    """
    scale = _check(q, k, causal, block_rows, block_cols)
    traffic = Traffic() if traffic is None else traffic
    n_queries, n_keys = q.size(-2), k.size(-2)
    delta = traffic.store((traffic.load(grad_out) * traffic.load(out)).sum(dim=-1))  # D: (B, H, N)
    grad_q = traffic.store(torch.zeros_like(q))
    grad_k, grad_v = torch.empty_like(k), torch.empty_like(v)
    for cols in _blocks(n_keys, block_cols):
        k_j = traffic.load(k[..., cols.start : cols.stop, :])  # (B, H, Bc, d)
        v_j = traffic.load(v[..., cols.start : cols.stop, :])  # (B, H, Bc, dv)
        grad_k_j, grad_v_j = torch.zeros_like(k_j), torch.zeros_like(v_j)  # on chip
        for at, allowed in _query_blocks(n_queries, n_keys, cols, block_rows, causal, q.device):
            q_i = traffic.load(q[..., at, :])  # (B, H, Br, d)
            grad_out_i = traffic.load(grad_out[..., at, :])  # (B, H, Br, dv)
            lse_i = traffic.load(lse[..., at])[..., None]  # (B, H, Br, 1)
            delta_i = traffic.load(delta[..., at])[..., None]
            grad_q_i = traffic.load(grad_q[..., at, :])
            s_ij = _scores(q_i, k_j, scale, allowed)  # (B, H, Br, Bc)
            p_ij = torch.exp(s_ij - lse_i)  # the forward's weights, recomputed
            grad_v_j += p_ij.transpose(-2, -1) @ grad_out_i
            grad_p_ij = grad_out_i @ v_j.transpose(-2, -1)  # (B, H, Br, Bc)
            grad_s_ij = p_ij * (grad_p_ij - delta_i)
            grad_q[..., at, :] = traffic.store(grad_q_i + grad_s_ij @ k_j * scale)
            grad_k_j += grad_s_ij.transpose(-2, -1) @ q_i * scale
        grad_k[..., cols.start : cols.stop, :] = traffic.store(grad_k_j)
        grad_v[..., cols.start : cols.stop, :] = traffic.store(grad_v_j)
    return grad_q, grad_k, grad_v


class _TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, block_rows, block_cols):
        out, lse = tiled_attention_forward(q, k, v, causal, block_rows, block_cols)
        ctx.save_for_backward(q, k, v, out, lse)  # L, not the N x N weights
        ctx.settings = (causal, block_rows, block_cols)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grads = tiled_attention_backward(q, k, v, out, lse, grad_out, *ctx.settings)
        return (*grads, None, None, None)


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool = False,
    block_rows: int = 64,
    block_cols: int = 64,
) -> Tensor:
    """softmax(Q K^T / sqrt(d)) V, forward by `tiled_attention_forward`, backward by
    `tiled_attention_backward` (autograd calls it; only Q, K, V, O and L are saved).

    Args:
        q: (B, H, N, d) queries.
        k: (B, H, S, d) keys.
        v: (B, H, S, dv) values.
        causal: forbid keys after each query, the queries being the last N of S positions.
        block_rows: Br, queries per block.
        block_cols: Bc, keys per block.

    Returns:
        (B, H, N, dv) outputs.

    Raises:
        ValueError: for a block size below 1, or `causal` with N > S.
    """
    return _TiledAttention.apply(q, k, v, causal, block_rows, block_cols)
