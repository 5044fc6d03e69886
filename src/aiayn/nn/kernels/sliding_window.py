"""Sliding-window attention: local attention whose time and memory grow linearly with length.

Each query attends the keys within `window` positions of it, plus a few global tokens
(Longformer, Beltagy et al. 2020, section 3.1; BigBird, Zaheer et al. 2020, section 2).

Shape legend:
    B batch, T query length, S key/value length (T <= S: the queries are the last
    T positions, the earlier keys come from a cache),
    H query heads, Hkv key/value heads, G = H / Hkv query heads per key/value head,
    Dk query/key head size, Dv value head size,
    w the window, n query blocks of b queries each, c blocks in one chunk,
    W keys per block: the global keys, then the span of keys around the block.

How it stays linear: the T queries are cut into n blocks of b = w positions (fewer
when T or S is shorter). The queries of a block, at positions start ... start + b - 1,
may only see keys in start - w ... start + b - 1 + w (causal: up to start + b - 1), so
each block attends one span of b + 2w keys (causal b + w) plus the global keys: n
small attention problems of (b, W) scores each, O(T w) in all instead of the (T, S)
of dense attention. The blocks go to `aiayn.nn.attention.attend` as one batch, so that
SDPA's fused kernel computes them without storing the scores (its math fallback, with
dropout for example, stores them). The spans of neighbouring blocks overlap: each
block gets a copy of its keys and values (about 3x k and v in all) and a (b, W) mask.
Without autograd, blocks go a chunk at a time, so that those copies stay bounded
whatever the length. Global queries (positions < n_global) see every key and are
computed densely, n_global x S. Key/value heads serve their G query heads by folding
the G heads into a block's rows, never by copying k and v per query head.

Departures from the papers: the window is `window` positions on *each* side
(Longformer's w is the whole width, w / 2 a side); the global tokens are the first
`n_global` positions (BigBird-ITC style) rather than chosen per task; no dilation and
no random keys (BigBird's third component).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.nn.kernels import KERNELS, Kernel
from aiayn.nn.kernels.sdpa import attend

if TYPE_CHECKING:
    from aiayn.config import ModelConfig

# Without autograd, blocks go to `attend` a chunk at a time: a chunk gathers at most
# about this many key, value and (for SDPA's math fallback) score elements, 64 MiB in
# float32, so that inference memory stays bounded whatever the length. Under autograd
# all blocks go at once; their gathered keys and values are kept for the backward
# pass: O(T (Dk + Dv) W / b) in all.
ELEMENTS_PER_CHUNK = 2**24


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

    The same result as `aiayn.nn.attention.attend` with the mask
    `band_mask(T, S, window, causal, n_global) & key_mask`: query i, at absolute
    position p = S - T + i, may attend key j iff
    (not causal and |p - j| <= window) or (causal and 0 <= p - j <= window),
    or j < n_global (a global key; causal: only j <= p),
    or p < n_global (a global query sees every key; causal: only j <= p);
    and always only where key_mask[b, j] is True. A query with no key to attend gets
    a zero output, not NaN. Time is O(T (w + n_global) + n_global S) and memory linear
    in T, never (T, S); see the module docstring for the blocked scheme.

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
    width = n_global + span  # W
    # Row r of a block stands at start + r, column c of its span at start - reach + c:
    # p - j = reach + r - c, the same for every block.
    distance = reach + torch.arange(block, device=q.device)[:, None]
    distance = distance - torch.arange(span, device=q.device)[None, :]  # (b, span)
    band = (distance >= -ahead) & (distance <= reach)

    per_block = batch * width * (n_kv_heads * (d_k + d_v) + n_heads * block)
    chunk = max(1, ELEMENTS_PER_CHUNK // per_block)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        # One chunk: autograd keeps every chunk's keys anyway, and each chunk's backward
        # would scatter into a whole-length gradient (chunks x S work).
        chunk = n_blocks
    out = q.new_empty(batch, n_heads, n_blocks * block, d_v)
    out_blocks = out.view(batch, n_kv_heads, group, n_blocks, block, d_v)
    for lo in range(0, n_blocks, chunk):
        hi = min(lo + chunk, n_blocks)
        first = offset + lo * block - reach  # the chunk's first span starts here
        starts = block * torch.arange(hi - lo, device=q.device)[:, None]  # (c, 1), from first
        key_pos = first + starts + torch.arange(span, device=q.device)  # (c, span)
        # Global keys are attended once, in their own columns, not again inside a span.
        local_ok = key_mask[:, key_pos.clamp(0, s_len - 1)]  # (B, c, span)
        local_ok = local_ok & (key_pos >= n_global) & (key_pos < s_len)
        local_ok = local_ok[:, :, None, :] & band  # (B, c, b, span)
        global_ok = key_mask[:, None, None, :n_global]  # (B, 1, 1, n_global)
        if causal:
            query_pos = first + reach + starts[:, :, None]  # (c, 1, 1)
            query_pos = query_pos + torch.arange(block, device=q.device)[:, None]  # (c, b, 1)
            global_ok = global_ok & (torch.arange(n_global, device=q.device) <= query_pos)
        global_ok = global_ok.expand(batch, hi - lo, block, n_global)
        allowed = torch.cat([global_ok, local_ok], dim=-1)  # (B, c, b, W)
        allowed = allowed[:, :, None].expand(-1, -1, group, -1, -1)  # (B, c, G, b, W)
        # (B, H, c b, Dk) -> (B c, Hkv, G b, Dk): a block's rows are its G heads' queries.
        rows = q[:, :, lo * block : hi * block]
        rows = F.pad(rows, (0, 0, 0, (hi - lo) * block - rows.size(2)))
        rows = rows.view(batch, n_kv_heads, group, hi - lo, block, d_k).permute(0, 3, 1, 2, 4, 5)
        chunk_out, _ = attend(
            rows.reshape(batch * (hi - lo), n_kv_heads, group * block, d_k),
            _block_keys(k, first, hi - lo, block, span, n_global),
            _block_keys(v, first, hi - lo, block, span, n_global),
            allowed.reshape(batch * (hi - lo), 1, group * block, width),
            dropout_p=dropout_p,
        )  # (B c, Hkv, G b, Dv)
        chunk_out = chunk_out.view(batch, hi - lo, n_kv_heads, group, block, d_v)
        out_blocks[:, :, :, lo:hi] = chunk_out.permute(0, 2, 3, 1, 4, 5)

    n_global_queries = max(0, min(t_len, n_global - offset))
    if n_global_queries > 0:
        # Global queries see every key (causal: every earlier one): dense, n_global x S.
        query_pos = offset + torch.arange(n_global_queries, device=q.device)[:, None]
        allowed = key_mask[:, None, None, :]  # (B, 1, 1, S)
        if causal:
            allowed = allowed & (torch.arange(s_len, device=q.device) <= query_pos)
        out[:, :, :n_global_queries], _ = attend(
            q[:, :, :n_global_queries], k, v, allowed, dropout_p=dropout_p
        )
    return out[:, :, :t_len]  # (B, H, T, Dv)


def _block_keys(
    x: Tensor, first: int, n_blocks: int, block: int, span: int, n_global: int
) -> Tensor:
    """Each block's keys (or values): the global ones, then the span around the block.

    Block m's span is positions first + m b ... first + m b + span - 1; positions
    outside 0 ... S - 1 give zeros (the caller masks them).

    Args:
        x: (B, Hkv, S, D) keys or values.
        first: the position the first block's span starts at (may be negative).
        n_blocks: c, the blocks.
        block: b, positions from one block's span to the next's.
        span: positions in a span.
        n_global: the first n_global positions are global.

    Returns:
        (B c, Hkv, n_global + span, D), contiguous.
    """
    batch, heads, length, size = x.shape
    last = first + (n_blocks - 1) * block + span
    rows = x[:, :, max(first, 0) : min(last, length)]
    if first < 0 or last > length:
        rows = F.pad(rows, (0, 0, max(0, -first), max(0, last - length)))
    spans = rows.unfold(2, span, block).permute(0, 2, 1, 4, 3)  # (B, c, Hkv, span, D), a view
    global_part = x[:, None, :, :n_global].expand(-1, n_blocks, -1, -1, -1)
    return torch.cat([global_part, spans], dim=3).view(batch * n_blocks, heads, -1, size)


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


@KERNELS.register("sliding_window")
class SlidingWindowKernel(Kernel):
    """Local attention: each query sees keys within `window` positions, plus `n_global` tokens.

    Linear in length (`sliding_window_attention`). It takes a key-padding mask only,
    (B, 1, 1, S), and no position bias. With `need_weights` it runs the explicit path
    with the equivalent band mask, so the weights can be drawn. Its settings are its
    options (`ModelConfig.attention_options`): `window` (default 256) and
    `global_tokens` (default 0); runs saved before they moved there, with
    `attention_window` and `global_tokens` beside the other fields, still load.

    Args:
        window: keys within this many positions of the query (>= 1).
        n_global: the first this many positions attend and are attended everywhere (>= 0).

    Raises:
        ValueError: an option out of range, naming it.
    """

    takes_bias = False
    takes_full_mask = False
    full_scores = False
    options = ("window", "global_tokens")

    def __init__(self, window: int = 256, n_global: int = 0) -> None:
        for name, value, least in (("window", window, 1), ("global_tokens", n_global, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(
                    f"ModelConfig.attention_options: sliding_window's {name} must be an "
                    f"integer >= {least}, got {value!r}"
                )
        self.window, self.n_global = window, n_global

    @classmethod
    def from_config(
        cls, cfg: ModelConfig, window: int = 256, global_tokens: int = 0
    ) -> SlidingWindowKernel:
        return cls(window, global_tokens)

    def __repr__(self) -> str:
        return f"SlidingWindowKernel(window={self.window}, n_global={self.n_global})"

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
        need_weights: bool = False,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        if bias is not None:
            raise ValueError("sliding_window attention takes no position bias")
        if mask is not None and mask.size(-2) != 1:
            raise ValueError(
                f"sliding_window attention takes a key mask (B, 1, 1, S), got {tuple(mask.shape)}"
            )
        if need_weights:
            band = band_mask(q.size(-2), k.size(-2), self.window, causal, self.n_global, q.device)
            return attend(q, k, v, band if mask is None else mask & band, False, dropout_p, True)
        key_mask = None if mask is None else mask[:, 0, 0, :]  # (B, S)
        out = sliding_window_attention(
            q, k, v, self.window, causal, key_mask, self.n_global, dropout_p
        )
        return out, None
