"""The sub-layers of a decoding step over slots: projections, rotation, the kernel call.

`aiayn.inference.static_step.StaticStep` keeps the slots (their stores, positions and
sources); this module does the arithmetic of one step's layers over them:

- `SlotAttention`: a layer's self-attention (this step's keys and values written at
  each slot's own position, then attended) and cross-attention (the stored source of
  each slot group), each through the kernel's `attend_slots`, with rotary positions
  per slot; the weights' products, through plain copies of oneDNN-packed weights once
  compiling (an opaque packed tensor does not trace), and int8 ones through
  `aiayn.inference.frozen_products.int8_product` over their int8 weights' plain tensors;
- `self_spans`, `cross_spans`: what the slots attend, cut into calls over consecutive
  slot groups (`SlotSpan`, with the mask made once per step as a float bias).

Shape legend: N slots, L target positions, S source positions, D d_model, H heads, Hkv
key/value heads, Dk / Dv head sizes, G slots per group.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.inference.frozen import (
    FrozenCrossAttention,
    FrozenFeedForward,
    FrozenLinear,
    FrozenSelfAttention,
    Int8Linear,
    int8_product,
)
from aiayn.nn.attention import MultiHeadAttention, merge_heads, split_heads
from aiayn.nn.kernels import SlotSpan
from aiayn.nn.positions.rotary import RotaryPositions

SPAN_COST = 64
"""What one more attention call costs an eager step, in the positions one slot attends:
consecutive slot groups are attended in one call while the positions that adds (every
slot attending the call's furthest) cost less than a call of their own. On one thread
a call costs about 10 us more and a slot's position, its keys and values cache-cold,
0.15 to 0.3 us; on the quickstart's test verses 64 did as well as 0, 256 or no cut."""


class SlotAttention:
    """One step's sub-layers over slot rows, for a literal or frozen decoder.

    Args:
        rotary: the decoder's rotary scheme (queries and keys rotated by each slot's
            position), or None.

    Attributes:
        written: None, or (while the step is exported) the list each self-attention
            appends its new keys and values to instead of writing its stores
            (AOTInductor leaves its inputs unchanged: the caller writes them).
    """

    def __init__(self, rotary: RotaryPositions | None) -> None:
        self.rotary = rotary
        self.written: list[Tensor] | None = None
        # packed product -> plain weight, or an int8 one's plain tensors (`unpack`)
        self._plain: dict[int, Tensor | tuple[Tensor, Tensor, Tensor | None]] = {}

    def unpack(self, model: nn.Module) -> None:
        """Plain copies of the frozen model's packed weights, for the compiler: an opaque
        packed tensor does not trace, and Inductor lays out plain ones itself. An int8
        product (`Int8Linear`, a TorchScript object AOTInductor cannot take) is then
        multiplied by `int8_product` over its int8 weight's plain tensors."""
        for module in model.modules():
            packed = getattr(module, "packed", None)
            if isinstance(module, FrozenLinear) and packed is not None:
                self._plain.setdefault(id(module), packed.to_dense())
            elif isinstance(module, Int8Linear):
                self._plain.setdefault(id(module), module.int8_weight())

    def product(self, linear: nn.Module, x: Tensor) -> Tensor:
        """`linear(x)`; a packed product through its plain copy once unpacked."""
        plain = self._plain.get(id(linear))
        if plain is None:
            return linear(x)
        if isinstance(plain, tuple):  # int8
            return int8_product(x, *plain, relu=linear.relu)
        out = F.linear(x, plain, linear.bias)
        return F.relu(out) if linear.relu else out

    def feed_forward(self, ffn: nn.Module, x: Tensor) -> Tensor:
        """(N, 1, D) -> (N, 1, D): the position-wise FFN, literal or frozen."""
        if not isinstance(ffn, FrozenFeedForward):
            return ffn(x)
        h = self.product(ffn.linear1, x)  # (N, 1, F)
        return self.product(ffn.linear2, h if ffn.activation is None else ffn.activation(h))

    def self_attention(
        self,
        attention: MultiHeadAttention | FrozenSelfAttention,
        h: Tensor,
        keys: Tensor,
        values: Tensor,
        positions: Tensor,
        spans: list[SlotSpan],
    ) -> Tensor:
        """(N, 1, D) -> (N, 1, D): this step's keys and values written at `positions` of
        the stores `keys` (N, Hkv, L, Dk) and `values` (N, Hkv, L, Dv), then attended,
        span by span, over the stores' positions written so far."""
        if isinstance(attention, FrozenSelfAttention):
            q, k, v = self.product(attention.qkv_proj, h).split(attention.sizes, dim=-1)
        else:
            q, k, v = attention.q_proj(h), attention.k_proj(h), attention.v_proj(h)
        q = split_heads(q, attention.n_heads)  # (N, H, 1, Dk)
        k = split_heads(k, attention.n_kv_heads)  # (N, Hkv, 1, Dk)
        v = split_heads(v, attention.n_kv_heads)
        if self.rotary is not None:
            q, k = self._rotate(q, positions), self._rotate(k, positions)
        rows = h.size(0)
        where = positions[:, None, None, None]
        k, v = k.to(keys.dtype), v.to(values.dtype)
        if self.written is None:  # (N, Hkv, L, Dk) written at (slot, :, its position)
            slots = torch.arange(rows, device=positions.device)
            keys[slots, :, positions] = k[:, :, 0]
            values[slots, :, positions] = v[:, :, 0]
        else:  # exported: the caller writes them (AOTInductor leaves its inputs unchanged)
            keys = keys.scatter(2, where.expand(k.shape), k)
            values = values.scatter(2, where.expand(v.shape), v)
            self.written += [k, v]
        out = attention.kernel.attend_slots(q, keys, values, spans, attention.kv_of_head)
        return self._output(attention, out)

    def cross_attention(
        self,
        attention: MultiHeadAttention | FrozenCrossAttention,
        h: Tensor,
        keys: Tensor,
        values: Tensor,
        spans: list[SlotSpan],
        group: int,
    ) -> Tensor:
        """(N, 1, D) -> (N, 1, D): attend the stored source of each slot group, `keys`
        (N / G, Hkv, S, Dk) and `values` (N / G, Hkv, S, Dv), span by span (as far as
        the span's furthest source reaches); a group's `group` slots attend its one
        source as `group` queries of one row."""
        q = split_heads(self.product(attention.q_proj, h), attention.n_heads)  # (N, H, 1, Dk)
        rows, heads = q.size(0), q.size(1)
        # (N, H, 1, Dk) -> (N / G, H, G, Dk): each group's queries side by side
        q = q.view(rows // group, group, heads, -1).transpose(1, 2)
        out = attention.kernel.attend_slots(q, keys, values, spans, attention.kv_of_head)
        # (N / G, H, G, Dv) -> (N, H, 1, Dv)
        out = out.transpose(1, 2).reshape(rows, heads, 1, -1)
        return self._output(attention, out)

    def _output(self, attention: nn.Module, out: Tensor) -> Tensor:
        """(N, H, 1, Dv) heads -> (N, 1, D) through W^O (a literal module's head mask
        applied)."""
        head_mask = getattr(attention, "head_mask", None)
        if head_mask is not None:
            out = out * head_mask.to(out.dtype)[..., None, None]
        return self.product(attention.out_proj, merge_heads(out))

    def _rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """`RotaryPositions.rotate` with a position per row: x (N, heads, 1, Dk)."""
        cos = self.rotary.cos[positions][:, None, None, :].float()  # (N, 1, 1, Dk)
        sin = self.rotary.sin[positions][:, None, None, :].float()
        x32 = x.float()
        first, second = x32.chunk(2, dim=-1)
        half_turned = torch.cat([-second, first], dim=-1)
        return (x32 * cos + half_turned * sin).to(x.dtype)


def kv_sizes(attention: nn.Module) -> tuple[int, int, int]:
    """(Hkv, Dk, Dv) of an attention sub-layer, literal or frozen."""
    if isinstance(attention, MultiHeadAttention):
        return attention.n_kv_heads, attention.d_k, attention.d_v
    sizes = attention.sizes[-2:]  # the frozen forms: ..., Hkv Dk, Hkv Dv
    heads = attention.n_kv_heads
    return heads, sizes[0] // heads, sizes[1] // heads


def cross_keys_values(
    attention: MultiHeadAttention | FrozenCrossAttention, memory: Tensor
) -> tuple[Tensor, Tensor]:
    """(B, S, D) encoder output -> (B, Hkv, S, Dk) keys and (B, Hkv, S, Dv) values."""
    if isinstance(attention, FrozenCrossAttention):
        k, v = attention.kv_proj(memory).split(attention.sizes, dim=-1)
    else:
        k, v = attention.k_proj(memory), attention.v_proj(memory)
    return split_heads(k, attention.n_kv_heads), split_heads(v, attention.n_kv_heads)


def self_spans(
    positions: Tensor,
    group: int,
    fixed_end: int | None,
    bias_table: Tensor | None,
    dtype: torch.dtype,
) -> list[SlotSpan]:
    """The self-attention spans of the slots at `positions` (N,), in groups of `group`.

    Args:
        positions: (N,) each slot's position this step.
        group: consecutive slots cut together (never apart).
        fixed_end: None: each call attends the positions written so far up to its furthest
            slot, the groups cut into calls as `SPAN_COST` says; else one call over
            `fixed_end` positions (a compiled step's fixed shapes).
        bias_table: (H, L, L) the position scheme's bias (row p: the query at p), or None.
        dtype: the float bias's dtype.
    """
    groups = positions.size(0) // group
    if fixed_end is None:
        ends = (positions.view(groups, group).amax(dim=1) + 1).tolist()
        bounds = merged(ends, group)
    else:
        bounds = [(0, groups, fixed_end)]
    spans = []
    for a, b, end in bounds:
        at = positions[a * group : b * group]
        written = torch.arange(end, device=positions.device) <= at[:, None]  # (n, end)
        written = written[:, None, None, :]  # (n, 1, 1, end)
        if bias_table is None:
            bias = masking(written, dtype)
        else:  # (H, L, L): row p is the query at position p
            bias = bias_table[:, at, :end].transpose(0, 1)[:, :, None, :]
            bias = torch.where(written, bias, float("-inf"))  # (n, H, 1, end)
        spans.append(SlotSpan(slice(a * group, b * group), end, bias))
    return spans


def cross_spans(
    source_mask: Tensor, source_ends: Tensor | None, dtype: torch.dtype
) -> list[SlotSpan]:
    """The cross-attention spans of the slot groups whose sources `source_mask` holds.

    Args:
        source_mask: (N / G, S) True at each group's real source tokens.
        source_ends: (N / G,) how far each group's source reaches: each call attends up
            to its furthest, the groups cut into calls as `SPAN_COST` says; None: one
            call over all S (a compiled step's fixed shapes).
        dtype: the float bias's dtype.
    """
    if source_ends is None:
        bounds = [(0, source_mask.size(0), source_mask.size(1))]
    else:
        bounds = merged(source_ends.clamp(min=1).tolist(), 1)
    spans = []
    for a, b, end in bounds:
        # an empty group attends everything (finite junk, never NaN, which would reach
        # the values a later sentence in its slots masks out: 0 x NaN is NaN)
        mask = source_mask[a:b, :end]
        mask = mask | ~mask.any(dim=1, keepdim=True)
        spans.append(SlotSpan(slice(a, b), end, masking(mask[:, None, None, :], dtype)))
    return spans


def masking(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool mask (True = may attend) as the float bias the kernel adds: 0 or -inf.
    Made once per step and span, for every layer (SDPA would convert a bool mask at
    each call)."""
    bias = torch.full(allowed.shape, float("-inf"), dtype=dtype, device=allowed.device)
    return bias.masked_fill_(allowed, 0.0)


def merged(ends: list[int], rows: int) -> list[tuple[int, int, int]]:
    """Consecutive units (slot groups of `rows` slots each, attending up to `ends`) cut
    into calls: (first, past the last, positions attended) each. A unit joins the call
    before it while the positions that adds (every slot attending the call's furthest)
    cost at most what a call of its own would (`SPAN_COST`)."""
    calls: list[tuple[int, int, int]] = []
    for unit, end in enumerate(ends):
        if calls:
            first, _, furthest = calls[-1]
            together = (unit + 1 - first) * rows * max(furthest, end)
            apart = (unit - first) * rows * furthest + rows * end + SPAN_COST
            if together <= apart:
                calls[-1] = (first, unit + 1, max(furthest, end))
                continue
        calls.append((unit, unit + 1, end))
    return calls
