"""Scaled dot-product attention (section 3.2.1) and multi-head attention (3.2.2).

Shape legend:
    B batch, T query length, S key/value length,
    H query heads, Hkv key/value heads (H is a multiple of Hkv),
    D d_model, Dk query/key head size, Dv value head size.

`attend` is the attention math alone; `MultiHeadAttention` owns the projections
around it and, during incremental decoding, a `LayerKV` store of past keys and
values. Masks are bool with True = may attend (see `aiayn.nn.masks`); position
biases (relative, ALiBi) are float and added to the scores.

The attention kernel is chosen once, when a `MultiHeadAttention` is built: `attend`
by default, or any registered kernel (`aiayn.nn.kernels`: SDPA, the explicit path
that always has the weights, a sliding window, ...). This module is the training model, as
literal as the paper; fast inference is `aiayn.inference.frozen.freeze`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.nn.masks import causal_mask

if TYPE_CHECKING:
    from aiayn.nn.positions import PositionScheme


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T / sqrt(d_k) + bias) V, with masked scores set to -inf before the softmax.

    Two paths with one meaning: `torch.nn.functional.scaled_dot_product_attention`
    (fused kernels, FlashAttention-class on GPU) unless `need_weights`, and an
    explicit path that also returns the attention weights. A query that may attend
    no key at all (a fully padded row) gets a zero output and zero weights, not NaN.
    A position bias goes to SDPA as a float mask, so the fused path stays.

    Args:
        q: (B, H, T, Dk) queries.
        k: (B, Hkv, S, Dk) keys.
        v: (B, Hkv, S, Dv) values.
        mask: bool, broadcastable to (B, H, T, S); True = may attend.
        causal: also forbid keys after each query; with T < S the queries are the
            last T positions (the earlier keys come from a cache).
        dropout_p: dropout on the attention weights.
        need_weights: take the explicit path and return the weights.
        bias: float, broadcastable to (B, H, T, S), added to the scaled scores
            (relative-position biases, ALiBi).

    Returns:
        (B, H, T, Dv) outputs and, if `need_weights`, the (B, H, T, S) weights.
    """
    n_heads, n_kv_heads = q.size(1), k.size(1)
    if n_heads % n_kv_heads != 0:
        raise ValueError(
            f"query heads ({n_heads}) must be a multiple of key/value heads ({n_kv_heads})"
        )
    t_len, s_len = q.size(-2), k.size(-2)
    if causal and t_len == 1:
        causal = False  # one query, the newest position: it may attend every key
    if causal and (mask is not None or bias is not None or need_weights or t_len != s_len):
        # SDPA's is_causal aligns to the top-left; with a cache we need bottom-right.
        causal_part = causal_mask(t_len, s_len, device=q.device)
        mask = causal_part if mask is None else mask & causal_part
        causal = False
    dtype = q.dtype
    in_float32 = not need_weights and _float32_under_cpu_autocast(q)
    if in_float32:  # see _float32_under_cpu_autocast
        q, k, v = q.float(), k.float(), v.float()
    # Rows with no key to attend: let them attend everything, zero them afterwards,
    # so that neither the output nor its gradient becomes NaN.
    has_key = None
    if mask is not None:
        has_key = mask.any(dim=-1, keepdim=True)  # (.., T, 1)
        mask = mask | ~has_key
    scores_mask = mask
    if bias is not None:
        bias = bias.to(q.dtype)
        scores_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))

    if not need_weights:
        with torch.autocast("cpu", enabled=False) if in_float32 else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=scores_mask,
                dropout_p=dropout_p,
                is_causal=causal,
                enable_gqa=n_kv_heads != n_heads,
            ).to(dtype)
        if has_key is not None:
            out = out.masked_fill(~has_key, 0.0)
        return out, None

    if n_kv_heads != n_heads:  # each key/value head serves a group of query heads
        k = k.repeat_interleave(n_heads // n_kv_heads, dim=1)
        v = v.repeat_interleave(n_heads // n_kv_heads, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if scores_mask is not None and scores_mask.dtype == torch.bool:
        scores = scores.masked_fill(~scores_mask, float("-inf"))
    elif scores_mask is not None:
        scores = scores + scores_mask
    weights = scores.softmax(dim=-1)
    if has_key is not None:
        weights = weights.masked_fill(~has_key, 0.0)
    out = F.dropout(weights, p=dropout_p) @ v  # (B, H, T, Dv)
    return out, weights


def _float32_under_cpu_autocast(q: Tensor) -> bool:
    """Whether the fused path runs in float32 although CPU autocast gave it bfloat16.

    Mixed-precision training on the CPU (`TrainConfig.precision` bf16) autocasts the
    projections to bfloat16, and SDPA with them; but PyTorch's CPU kernels of fused
    attention are slower in bfloat16 than in float32 (forward and backward;
    `benchmarks/profile_train.py` shows it), so the attention itself is computed in float32, as the softmax of
    mixed-precision training usually is, and its output returned in bfloat16.
    """
    return q.device.type == "cpu" and q.dtype == torch.bfloat16 and torch.is_autocast_enabled("cpu")


AttentionFunction = Callable[..., tuple[Tensor, Tensor | None]]
"""kernel(q, k, v, mask, causal, dropout_p, need_weights, bias) -> (out, weights or None):
`attend`, or an `aiayn.nn.kernels.Kernel`."""


class LayerKV:
    """Keys and values of one attention sub-layer, kept across decoding steps.

    A `static` store (encoder-decoder attention) is filled once from the encoder
    output; with `group` G > 1 each stored row serves G consecutive query rows
    (beam search's hypotheses of one sentence, in `aiayn.inference.frozen`). A growing store (decoder self-attention) gets each step's keys and
    values appended with `append`.

    `key` and `value` are (B, Hkv, L, D) tensors. A growing store keeps them as
    views of time-major (capacity, B, Hkv, D) buffers with room to grow, so that a
    step writes only its own keys and values instead of copying the whole prefix
    (torch.cat would make decoding quadratic in copies). `reorder` copies only the
    rows whose source differs while the number of rows stays (beam search's
    parents) and, when the batch shrinks, the kept prefix once, into a second
    buffer. Assigning `key` and `value` directly is allowed; the buffers are then
    rebuilt on the next append.
    """

    def __init__(
        self,
        static: bool,
        key: Tensor | None = None,
        value: Tensor | None = None,
        group: int = 1,
    ):
        self.static = static
        self.key, self.value = key, value
        self.group = group  # query rows per stored row (a static store shared by beams)
        self._buffers: list[Tensor] | None = None  # key, value, spare key, spare value
        self._view: Tensor | None = None  # the `key` the buffers back; another means stale

    @property
    def length(self) -> int:
        """Positions stored (0 while empty)."""
        return 0 if self.key is None else self.key.size(2)

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, Hkv, t, D) new keys and values after the prefix; return the whole.

        Returns:
            (B, Hkv, L + t, Dk) keys and (B, Hkv, L + t, Dv) values, views of the store.
        """
        length = 0 if self.key is None else self.key.size(2)
        end = length + key.size(2)
        if not self._backed() or end > self._buffers[0].size(0):
            self._allocate(key, value, capacity=max(2 * end, 16))
        key_buffer, value_buffer = self._buffers[:2]
        key_buffer[length:end] = key.permute(2, 0, 1, 3)  # (t, B, Hkv, Dk)
        value_buffer[length:end] = value.permute(2, 0, 1, 3)
        self._set_views(end)
        return self.key, self.value

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (beam search: follow each hypothesis's parent)."""
        if self.key is None:
            return
        if not self._backed():
            self.key = self.key.index_select(0, index)
            self.value = self.value.index_select(0, index)
            self._buffers = None
            return
        length = self.key.size(2)
        key_buffer, value_buffer, spare_key, spare_value = self._buffers
        if key_buffer.size(1) == index.numel():  # same rows, permuted and repeated
            # Copy only the rows that change (beam search: a third of them per step
            # with random weights), gathering them before any is overwritten.
            moved = (index != torch.arange(index.numel(), device=index.device)).nonzero()
            if moved.numel() > 0:
                moved = moved.squeeze(1)
                source = index[moved]
                for buffer in (key_buffer, value_buffer):
                    prefix = buffer[:length]
                    prefix.index_copy_(1, moved, prefix.index_select(1, source))
            return
        if spare_key.size(1) != index.numel():  # the batch shrinks: new buffers
            shape = (spare_key.size(0), index.numel())
            spare_key = key_buffer.new_empty(shape + key_buffer.shape[2:])
            spare_value = value_buffer.new_empty(shape + value_buffer.shape[2:])
        torch.index_select(key_buffer[:length], 1, index, out=spare_key[:length])
        torch.index_select(value_buffer[:length], 1, index, out=spare_value[:length])
        self._buffers = [spare_key, spare_value, key_buffer, value_buffer]
        self._set_views(length)

    def _backed(self) -> bool:
        return self._buffers is not None and self.key is self._view

    def _allocate(self, key: Tensor, value: Tensor, capacity: int) -> None:
        batch, heads = key.size(0), key.size(1)
        buffers = [
            key.new_empty(capacity, batch, heads, key.size(-1)),
            value.new_empty(capacity, batch, heads, value.size(-1)),
        ]
        buffers += [torch.empty_like(b) for b in buffers]
        if self.key is not None:  # the prefix so far
            length = self.key.size(2)
            buffers[0][:length] = self.key.permute(2, 0, 1, 3)
            buffers[1][:length] = self.value.permute(2, 0, 1, 3)
        self._buffers = buffers

    def _set_views(self, length: int) -> None:
        self.key = self._buffers[0][:length].permute(1, 2, 0, 3)  # (B, Hkv, L, Dk)
        self.value = self._buffers[1][:length].permute(1, 2, 0, 3)
        self._view = self.key


@dataclass
class KVCache:
    """Per decoder layer: a growing self-attention store and, in an encoder-decoder,
    a static cross-attention store (empty for a decoder-only stack)."""

    self_attention: list[LayerKV] = field(default_factory=list)
    cross_attention: list[LayerKV] = field(default_factory=list)

    @classmethod
    def empty(cls, n_layers: int, cross: bool = True, group: int = 1) -> KVCache:
        """Stores for `n_layers` layers; `cross` adds static ones holding `group` rows' keys each."""
        return cls(
            self_attention=[LayerKV(static=False) for _ in range(n_layers)],
            cross_attention=[LayerKV(static=True, group=group) for _ in range(n_layers * cross)],
        )

    @property
    def length(self) -> int:
        """Positions already decoded (0 before the first step)."""
        return self.self_attention[0].length if self.self_attention else 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` in every store, in that order."""
        for store in (*self.self_attention, *self.cross_attention):
            store.reorder(index)


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(B, L, heads x size) -> (B, heads, L, size)."""
    batch, length, _ = x.shape
    return x.view(batch, length, n_heads, -1).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, heads, L, size) -> (B, L, heads x size): Concat(head_1, ..., head_h)."""
    batch, heads, length, size = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * size)


def regular_groups(n_heads: int, n_kv_heads: int) -> tuple[int, ...]:
    """For each of `n_heads` query heads, its key/value head: H / Hkv consecutive per group."""
    return tuple(h // (n_heads // n_kv_heads) for h in range(n_heads))


def _irregular_groups(
    n_heads: int, n_kv_heads: int, kv_of_head: tuple[int, ...] | None
) -> tuple[int, ...] | None:
    """`kv_of_head` checked, as a tuple, or None when it is the regular grouping."""
    regular = n_heads % n_kv_heads == 0
    if kv_of_head is None:
        if not regular:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
        return None
    kv_of_head = tuple(int(i) for i in kv_of_head)
    if len(kv_of_head) != n_heads or set(kv_of_head) != set(range(n_kv_heads)):
        raise ValueError(
            f"kv_of_head {kv_of_head} must name a key/value head in [0, {n_kv_heads}) for each "
            f"of the {n_heads} query heads, and use every key/value head"
        )
    if regular and kv_of_head == regular_groups(n_heads, n_kv_heads):
        return None
    return kv_of_head


def expand_kv(k: Tensor, v: Tensor, kv_of_head: tuple[int, ...] | None) -> tuple[Tensor, Tensor]:
    """Keys and values per query head, where query heads read key/value heads irregularly.

    (B, Hkv, S, D) -> (B, H, S, D) with `kv_of_head` (after pruning); unchanged with
    None (the regular grouping, which attention handles without copies).
    """
    if kv_of_head is None:
        return k, v
    index = torch.tensor(kv_of_head, device=k.device)
    return k.index_select(1, index), v.index_select(1, index)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O (section 3.2.2).

    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V). The same module serves encoder
    self-attention, causal decoder self-attention and encoder-decoder attention.
    With `n_kv_heads < n_heads`, groups of query heads share key/value heads
    (grouped-query attention; `n_kv_heads=1` is multi-query attention).

        mha = MultiHeadAttention(d_model=512, n_heads=8)
        out, weights = mha(x, x, need_weights=True)     # weights: (B, 8, T, T)

    Args:
        d_model: input and output width D.
        n_heads: query heads H.
        n_kv_heads: key/value heads Hkv (default `n_heads`); `n_heads` must be a
            multiple of it.
        d_k: query/key head size Dk (default `d_model // n_heads`).
        d_v: value head size Dv (default `d_model // n_heads`).
        dropout: dropout on attention weights.
        bias: biases on the four projections (the paper's affine maps have them).
        kernel: how the attention itself is computed (`aiayn.nn.kernels.build_kernel`;
            default `attend`, SDPA).
        kv_of_head: for each query head, the key/value head it reads, when that is
            not the regular grouping (H / Hkv consecutive query heads per key/value
            head): what is left after pruning heads of grouped-query attention
            (`aiayn.analysis.pruning`). Every key/value head must be read by some query head.

    Attributes:
        head_mask: None, or an (H,) tensor (or (B, H): one row per sentence) each
            head's output is multiplied by before W^O: 0 silences a head at
            inference (Michel et al. 2019); a tensor of ones that requires grad
            gives each head's importance as the gradient of the loss with respect
            to it. Not saved in checkpoints.

    Raises:
        ValueError: heads that do not divide, or no head size given where d_model
            does not divide by n_heads.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        kernel: AttentionFunction = attend,
        kv_of_head: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.kv_of_head = _irregular_groups(n_heads, n_kv_heads, kv_of_head)
        if (d_k is None or d_v is None) and d_model % n_heads != 0:
            raise ValueError(
                f"d_model ({d_model}) is not divisible by n_heads ({n_heads}); give d_k and d_v"
            )
        d_k = d_model // n_heads if d_k is None else d_k
        d_v = d_model // n_heads if d_v is None else d_v
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_k, self.d_v = d_k, d_v
        self.dropout = dropout
        self.kernel = kernel
        self.head_mask: Tensor | None = None
        self.q_proj = nn.Linear(d_model, n_heads * d_k, bias=bias)  # W^Q of all heads
        self.k_proj = nn.Linear(d_model, n_kv_heads * d_k, bias=bias)  # W^K
        self.v_proj = nn.Linear(d_model, n_kv_heads * d_v, bias=bias)  # W^V
        self.out_proj = nn.Linear(n_heads * d_v, d_model, bias=bias)  # W^O: (h d_v) x d_model

    def forward(
        self,
        query: Tensor,
        source: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: LayerKV | None = None,
        need_weights: bool = False,
        rotary: PositionScheme | None = None,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from `query` to `source` (`query` itself by default: self-attention).

        Args:
            query: (B, T, D).
            source: (B, S, D) the keys and values come from; ignored when a static
                `cache` is already filled.
            mask: bool, broadcastable to (B, H, T, S); True = may attend.
            causal: causal self-attention (the decoder's).
            cache: this sub-layer's store for incremental decoding.
            need_weights: also return the (B, H, T, S) attention weights.
            rotary: a position scheme that rotates queries and keys (RoPE), applied
                at the cache's offset.
            bias: float (H, T, S) or broadcastable, added to the scores.

        Returns:
            (B, T, D) output and the weights or None.
        """
        source = query if source is None else source
        offset = 0 if cache is None else cache.length
        q = split_heads(self.q_proj(query), self.n_heads)  # (B, H, T, Dk)
        if rotary is not None:
            q = rotary.rotate(q, offset)
        if cache is not None and cache.static and cache.key is not None:
            k, v = cache.key, cache.value
        else:
            k = split_heads(self.k_proj(source), self.n_kv_heads)  # (B, Hkv, S, Dk)
            v = split_heads(self.v_proj(source), self.n_kv_heads)  # (B, Hkv, S, Dv)
            if rotary is not None:
                k = rotary.rotate(k, offset)
            if cache is not None and cache.static:
                cache.key, cache.value = k, v
            elif cache is not None:
                k, v = cache.append(k, v)
        k, v = expand_kv(k, v, self.kv_of_head)
        dropout_p = self.dropout if self.training else 0.0
        out, weights = self.kernel(q, k, v, mask, causal, dropout_p, need_weights, bias)
        if self.head_mask is not None:
            out = out * self.head_mask.to(out.dtype)[..., None, None]  # (B, H, T, Dv)
        return self.out_proj(merge_heads(out)), weights  # (B, T, D)
