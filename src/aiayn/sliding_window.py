"""Sliding-window attention: local attention whose time and memory grow linearly with length.

Each query attends the keys within `window` positions of it, plus a few global tokens
(Longformer, Beltagy et al. 2020, section 3.1; BigBird, Zaheer et al. 2020, section 2).

Shape legend:
    B batch, T query length, S key/value length (T <= S: the queries are the last
    T positions, the earlier keys come from a cache),
    H query heads, Hkv key/value heads, G = H / Hkv query heads per key/value head,
    Dk query/key head size, Dv value head size,
    w the window, n query blocks of b queries each,
    W keys per block: the global keys, then the keys around the block.

How it stays linear: the T queries are cut into n blocks of b = w positions (fewer
when T or S is shorter). The queries of a block at positions start ... start + b - 1
may only see keys in start - w ... start + b - 1 + w (causal: up to start + b - 1),
so each block scores one span of b + 2w keys (causal b + w), plus the global keys:
scores of shape (B, Hkv, n, G b, W), O(T w) instead of the (T, S) of dense attention.
The spans of neighbouring blocks overlap; they are strided views of one padded key
tensor (`Tensor.unfold`), not copies. Global queries (positions < n_global) see every
key and are computed densely, n_global x S. Key/value heads are shared by their G
query heads by folding the G heads into a block's rows, never by copying k and v.

Departures from the papers: the window is `window` positions on *each* side
(Longformer's w is the whole width, w / 2 a side); the global tokens are the first
`n_global` positions (BigBird-ITC style) rather than chosen per task; no dilation and
no random keys (BigBird's third component).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.attention import attend

# Blocks are scored a chunk at a time so that inference holds at most about this many
# score elements at once (64 MiB in float32), whatever the length. Under autograd each
# chunk's weights are kept for the backward pass anyway: O(H T W) in all.
SCORES_PER_CHUNK = 2**24


def band_mask(
    q_len: int,
    k_len: int,
    window: int,
    causal: bool = False,
    n_global: int = 0,
    device: torch.device | None = None,
) -> Tensor:
    """The dense mask `sliding_window_attention` applies, for tests and short inputs.

    Query i stands at absolute position p = k_len - q_len + i. It may attend key j iff
    j is within the window (|p - j| <= window; causal: 0 <= p - j <= window), or j is
    a global key (j < n_global), or p is a global query (p < n_global); in causal mode
    the last two only for j <= p.

    Args:
        q_len: queries T.
        k_len: keys S (>= q_len).
        window: w >= 1, positions seen on each side (causal: before).
        causal: forbid keys after the query.
        n_global: the first n_global positions are global tokens (>= 0).
        device: where to build the mask.

    Returns:
        (T, S) bool, True = may attend.

    Raises:
        ValueError: window < 1, q_len > k_len or n_global < 0.
    """
    _check_band(q_len, k_len, window, n_global)
    query_pos = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)  # (T, 1)
    key_pos = torch.arange(k_len, device=device)[None, :]  # (1, S)
    distance = query_pos - key_pos  # p - j, (T, S)
    ahead = 0 if causal else window  # positions after a query it may see
    local = (distance >= -ahead) & (distance <= window)
    is_global = (key_pos < n_global) | (query_pos < n_global)
    if causal:
        is_global = is_global & (distance >= 0)
    return local | is_global


def sliding_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    causal: bool = False,
    key_mask: Tensor | None = None,
    n_global: int = 0,
    dropout_p: float = 0.0,
) -> Tensor:
    """softmax(Q K^T / sqrt(Dk)) V over a band of keys, in time and memory linear in length.

    The same result as `aiayn.attention.attend` with the mask
    `band_mask(T, S, window, causal, n_global) & key_mask`: query i, at absolute
    position p = S - T + i, may attend key j iff
    (not causal and |p - j| <= window) or (causal and 0 <= p - j <= window),
    or j < n_global (a global key; causal: only j <= p),
    or p < n_global (a global query sees every key; causal: only j <= p);
    and always only where key_mask[b, j] is True. A query with no key to attend gets
    a zero output, not NaN. Memory is O(B H T (w + n_global)) plus the inputs; see the
    module docstring for the blocked scheme.

    Args:
        q: (B, H, T, Dk) queries, the last T of the S positions.
        k: (B, Hkv, S, Dk) keys; H must be a multiple of Hkv (grouped-query attention).
        v: (B, Hkv, S, Dv) values.
        window: w >= 1, positions seen on each side of a query (causal: before it).
        causal: forbid keys after each query.
        key_mask: (B, S) bool, True at real tokens; False (padding) is never attended.
        n_global: the first n_global positions are global tokens (>= 0).
        dropout_p: dropout on the attention weights (pass 0 in evaluation).

    Returns:
        (B, H, T, Dv) outputs.

    Raises:
        ValueError: window < 1, T > S, n_global < 0, dropout_p outside [0, 1), tensors
            that are not 4-D or disagree in batch, length or head size, H not a multiple
            of Hkv, or a key_mask that is not (B, S) bool.
    """
    _check_inputs(q, k, v, key_mask, dropout_p)
    batch, n_heads, t_len, d_k = q.shape
    n_kv_heads, s_len, d_v = k.size(1), k.size(2), v.size(-1)
    _check_band(t_len, s_len, window, n_global)
    if t_len == 0:
        return q.new_zeros(batch, n_heads, 0, d_v)
    group = n_heads // n_kv_heads
    offset = s_len - t_len  # absolute position of query 0
    reach = min(window, s_len - 1)  # a wider window sees no more keys
    ahead = 0 if causal else reach  # positions after a query it may see
    n_global = min(n_global, s_len)
    if key_mask is None:
        key_mask = torch.ones(batch, s_len, dtype=torch.bool, device=q.device)

    block = max(1, min(reach, t_len))
    n_blocks = math.ceil(t_len / block)
    span = reach + block + ahead  # keys around one block
    # Row r of block m stands at start + r, start = offset + m b; column c of its span
    # at start - reach + c; so p - j = reach + r - c, the same for every block.
    rows = torch.arange(block, device=q.device)[:, None]
    columns = torch.arange(span, device=q.device)[None, :]
    band = (reach + rows - columns >= -ahead) & (reach + rows - columns <= reach)  # (b, span)

    # Keys and values at positions first ... last - 1 (zeros outside 0 ... S - 1).
    first, last = offset - reach, offset + n_blocks * block + ahead
    k_local = _positions(k, first, last).unfold(2, span, block)  # (B, Hkv, n, Dk, span)
    v_local = _positions(v, first, last).unfold(2, span, block)  # (B, Hkv, n, Dv, span)
    key_pos = torch.arange(first, last, device=q.device)
    key_ok = key_mask[:, key_pos.clamp(0, s_len - 1)]  # (B, last - first)
    # Global keys are scored once, in their own columns, not again inside a span.
    key_ok = key_ok & (key_pos >= n_global) & (key_pos < s_len)
    local_ok = key_ok.unfold(1, span, block)[:, :, None, :] & band  # (B, n, b, span)

    k_global = k[:, :, None, :n_global].transpose(-1, -2)  # (B, Hkv, 1, Dk, n_global)
    v_global = v[:, :, None, :n_global].transpose(-1, -2)  # (B, Hkv, 1, Dv, n_global)
    query_pos = offset + torch.arange(n_blocks * block, device=q.device).view(n_blocks, block)
    global_ok = key_mask[:, None, None, :n_global]  # (B, 1, 1, n_global)
    if causal:
        global_pos = torch.arange(n_global, device=q.device)
        global_ok = global_ok & (global_pos <= query_pos[..., None])  # (B, n, b, n_global)
    global_ok = global_ok.expand(batch, n_blocks, block, n_global)

    # (B, H, n b, Dk) -> (B, Hkv, n, G b, Dk): a block's rows are its G heads' queries.
    q_blocks = F.pad(q * (1.0 / math.sqrt(d_k)), (0, 0, 0, n_blocks * block - t_len))
    q_blocks = q_blocks.view(batch, n_kv_heads, group, n_blocks, block, d_k).transpose(2, 3)
    q_blocks = q_blocks.reshape(batch, n_kv_heads, n_blocks, group * block, d_k)

    width = n_global + span  # W
    chunk = max(1, SCORES_PER_CHUNK // (batch * n_heads * block * width))
    outputs = []
    for lo in range(0, n_blocks, chunk):
        hi = min(lo + chunk, n_blocks)
        keys = torch.cat([k_global.expand(-1, -1, hi - lo, -1, -1), k_local[:, :, lo:hi]], -1)
        values = torch.cat([v_global.expand(-1, -1, hi - lo, -1, -1), v_local[:, :, lo:hi]], -1)
        allowed = torch.cat([global_ok[:, lo:hi], local_ok[:, lo:hi]], -1)  # (B, c, b, W)
        allowed = allowed[:, None, :, None]  # (B, 1, c, 1, b, W)
        scores = q_blocks[:, :, lo:hi] @ keys  # (B, Hkv, c, G b, W)
        scores = scores.view(batch, n_kv_heads, hi - lo, group, block, width)
        # The dtype's lowest value, not -inf: a row with no key stays finite (uniform
        # weights), and is zeroed below, as `attend` does. In place: the product's
        # backward needs its inputs, not its output.
        scores.masked_fill_(~allowed, torch.finfo(scores.dtype).min)
        weights = scores.softmax(dim=-1)
        if dropout_p > 0:
            weights = F.dropout(weights, p=dropout_p)
        weights = weights.view(batch, n_kv_heads, hi - lo, group * block, width)
        out = weights @ values.transpose(-1, -2)  # (B, Hkv, c, G b, Dv)
        out = out.view(batch, n_kv_heads, hi - lo, group, block, d_v)
        outputs.append(out.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0))
    out = torch.cat(outputs, dim=2).transpose(2, 3)  # (B, Hkv, G, n, b, Dv)
    out = out.reshape(batch, n_heads, n_blocks * block, d_v)[:, :, :t_len]  # (B, H, T, Dv)

    n_global_queries = max(0, min(t_len, n_global - offset))
    if n_global_queries == 0:
        return out
    # Global queries see every key (causal: every earlier one): dense, n_global x S.
    global_query_pos = offset + torch.arange(n_global_queries, device=q.device)[:, None]
    allowed = key_mask[:, None, None, :]  # (B, 1, 1, S)
    if causal:
        allowed = allowed & (torch.arange(s_len, device=q.device) <= global_query_pos)
    out_global, _ = attend(q[:, :, :n_global_queries], k, v, allowed, dropout_p=dropout_p)
    return torch.cat([out_global, out[:, :, n_global_queries:]], dim=2)


def _positions(x: Tensor, first: int, last: int) -> Tensor:
    """Rows first ... last - 1 of x's dim 2, zeros where outside 0 ... x.size(2) - 1."""
    length = x.size(2)
    inside = x[:, :, max(first, 0) : min(last, length)]
    return F.pad(inside, (0, 0, max(0, -first), max(0, last - length)))


def _check_band(q_len: int, k_len: int, window: int, n_global: int) -> None:
    if window < 1:
        raise ValueError(f"window must be >= 1 (positions on each side), got {window}")
    if q_len > k_len:
        raise ValueError(
            f"more queries than keys: T={q_len} > S={k_len} (the queries are the last T "
            "of the S positions)"
        )
    if n_global < 0:
        raise ValueError(f"n_global must be >= 0, got {n_global}")


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, dropout_p: float):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be (B, H, T, Dk), (B, Hkv, S, Dk), (B, Hkv, S, Dv); got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.size(0) == k.size(0) == v.size(0)) or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"q, k, v disagree in batch, key/value heads or length: shapes {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.size(-1) != k.size(-1):
        raise ValueError(f"query and key head sizes differ: {q.size(-1)} != {k.size(-1)}")
    if q.size(1) % k.size(1) != 0:
        raise ValueError(
            f"query heads ({q.size(1)}) must be a multiple of key/value heads ({k.size(1)})"
        )
    if key_mask is not None and (
        key_mask.dtype != torch.bool or tuple(key_mask.shape) != (k.size(0), k.size(2))
    ):
        raise ValueError(
            f"key_mask must be (B, S) = {(k.size(0), k.size(2))} bool, got "
            f"{tuple(key_mask.shape)} {key_mask.dtype}"
        )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
