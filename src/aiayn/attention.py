"""Scaled dot-product attention (section 3.2.1) and multi-head attention (3.2.2).

Shape legend:
    B batch, T query length, S key/value length,
    H query heads, Hkv key/value heads (H is a multiple of Hkv),
    D d_model, Dk query/key head size, Dv value head size.

`attend` is the attention math alone; `MultiHeadAttention` owns the projections
around it and, during incremental decoding, a `LayerKV` store of past keys and
values. Masks are bool with True = may attend (see `aiayn.masks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.linear import (
    Derived,
    InferenceWeights,
    Linear,
    cpu_inference,
    fast_linear,
    uses_autograd,
)
from aiayn.masks import causal_mask


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T / sqrt(d_k)) V, with masked scores set to -inf before the softmax.

    Two paths with one meaning: `torch.nn.functional.scaled_dot_product_attention`
    (fused kernels, FlashAttention-class on GPU) unless `need_weights`, and an
    explicit path that also returns the attention weights. A query that may attend
    no key at all (a fully padded row) gets a zero output and zero weights, not NaN.

    Args:
        q: (B, H, T, Dk) queries.
        k: (B, Hkv, S, Dk) keys.
        v: (B, Hkv, S, Dv) values.
        mask: bool, broadcastable to (B, H, T, S); True = may attend.
        causal: also forbid keys after each query; with T < S the queries are the
            last T positions (the earlier keys come from a cache).
        dropout_p: dropout on the attention weights.
        need_weights: take the explicit path and return the weights.

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
    if causal and (mask is not None or t_len != s_len):
        # SDPA's is_causal aligns to the top-left; with a cache we need bottom-right.
        causal_part = causal_mask(t_len, s_len, device=q.device)
        mask = causal_part if mask is None else mask & causal_part
        causal = False
    # Rows with no key to attend: let them attend everything, zero them afterwards,
    # so that neither the output nor its gradient becomes NaN.
    has_key = None
    if mask is not None:
        has_key = mask.any(dim=-1, keepdim=True)  # (.., T, 1)
        mask = mask | ~has_key

    if not need_weights:
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=dropout_p,
            is_causal=causal,
            enable_gqa=n_kv_heads != n_heads,
        )
        if has_key is not None:
            out = out.masked_fill(~has_key, 0.0)
        return out, None

    if n_kv_heads != n_heads:  # each key/value head serves a group of query heads
        k = k.repeat_interleave(n_heads // n_kv_heads, dim=1)
        v = v.repeat_interleave(n_heads // n_kv_heads, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if causal:
        mask = causal_mask(t_len, s_len, device=q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if has_key is not None:
        weights = weights.masked_fill(~has_key, 0.0)
    out = F.dropout(weights, p=dropout_p) @ v  # (B, H, T, Dv)
    return out, weights


class LayerKV:
    """Keys and values of one attention sub-layer, kept across decoding steps.

    A `static` store (encoder-decoder attention) is filled once from the encoder
    output; a growing store (decoder self-attention) gets each step's keys and
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

    def __init__(self, static: bool, key: Tensor | None = None, value: Tensor | None = None):
        self.static = static
        self.key, self.value = key, value
        self._buffers: list[Tensor] | None = None  # key, value, spare key, spare value
        self._view: Tensor | None = None  # the `key` the buffers back; another means stale

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
    """Per decoder layer: a growing self-attention store and a static cross-attention store."""

    self_attention: list[LayerKV] = field(default_factory=list)
    cross_attention: list[LayerKV] = field(default_factory=list)

    @classmethod
    def empty(cls, n_layers: int) -> KVCache:
        return cls(
            self_attention=[LayerKV(static=False) for _ in range(n_layers)],
            cross_attention=[LayerKV(static=True) for _ in range(n_layers)],
        )

    @property
    def length(self) -> int:
        """Target positions already decoded (0 before the first step)."""
        first = self.self_attention[0].key if self.self_attention else None
        return 0 if first is None else first.size(2)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` in every store, in that order."""
        for store in (*self.self_attention, *self.cross_attention):
            store.reorder(index)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O (section 3.2.2).

    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V). The same module serves encoder
    self-attention, causal decoder self-attention and encoder-decoder attention.
    With `n_kv_heads < n_heads`, groups of query heads share key/value heads
    (grouped-query attention; `n_kv_heads=1` is multi-query attention).

    Args:
        d_model: input and output width D.
        n_heads: query heads H.
        n_kv_heads: key/value heads Hkv; `n_heads` must be a multiple of it.
        d_k: query/key head size Dk.
        d_v: value head size Dv.
        dropout: dropout on attention weights.
        bias: biases on the four projections (the paper's affine maps have them).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        d_k: int,
        d_v: int,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_k, self.d_v = d_k, d_v
        self.dropout = dropout
        self.q_proj = Linear(d_model, n_heads * d_k, bias=bias)
        self.k_proj = Linear(d_model, n_kv_heads * d_k, bias=bias)
        self.v_proj = Linear(d_model, n_kv_heads * d_v, bias=bias)
        self.out_proj = Linear(n_heads * d_v, d_model, bias=bias)  # W^O: (h d_v) x d_model
        self._qkv_weight, self._qkv_bias = InferenceWeights(), Derived()

    def _project_qkv(self, x: Tensor) -> Tensor:
        """x [W^Q W^K W^V]^T + [b^Q b^K b^V]: self-attention's three projections in one matmul.

        The parameters stay separate (checkpoints name them q_proj, k_proj, v_proj).
        While autograd records they are concatenated at every call (the gradient
        flows back through the concatenation); otherwise once (see `aiayn.linear`).
        """
        linears = (self.q_proj, self.k_proj, self.v_proj)
        weights = [linear.weight for linear in linears]
        biases = [linear.bias for linear in linears if linear.bias is not None]
        if uses_autograd(x, *weights, *biases):
            return F.linear(x, torch.cat(weights), torch.cat(biases) if biases else None)
        bias = self._qkv_bias.get(biases, lambda: torch.cat(biases)) if biases else None
        if cpu_inference(x, *weights):
            return fast_linear(x, weights, bias, self._qkv_weight)
        return F.linear(x, torch.cat(weights), bias)

    def _split_heads(self, x: Tensor, n_heads: int) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, n_heads, -1).transpose(1, 2)  # (B, heads, L, head size)

    def forward(
        self,
        query: Tensor,
        source: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: LayerKV | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from `query` to `source` (the same tensor for self-attention).

        Args:
            query: (B, T, D).
            source: (B, S, D) the keys and values come from; ignored when a static
                `cache` is already filled. It may have fewer rows, B / G, each
                shared by G consecutive query rows (beam search's beams; the
                keys and values are then computed once per source row).
            mask: bool, broadcastable to (B, H, T, S); True = may attend.
            causal: causal self-attention (the decoder's).
            cache: this sub-layer's store for incremental decoding.
            need_weights: also return the (B, H, T, S) attention weights.

        Returns:
            (B, T, D) output and the weights or None.
        """
        batch, t_len, _ = query.shape
        static_hit = cache is not None and cache.static and cache.key is not None
        if source is query and not static_hit:  # self-attention: one matmul for Q, K, V
            sizes = [self.n_heads * self.d_k, self.n_kv_heads * self.d_k]
            sizes.append(self.n_kv_heads * self.d_v)
            q, k, v = self._project_qkv(query).split(sizes, dim=-1)
            q = self._split_heads(q, self.n_heads)  # (B, H, T, Dk)
            k = self._split_heads(k, self.n_kv_heads)  # (B, Hkv, T, Dk)
            v = self._split_heads(v, self.n_kv_heads)  # (B, Hkv, T, Dv)
        else:
            q = self._split_heads(self.q_proj(query), self.n_heads)  # (B, H, T, Dk)
        if static_hit:
            k, v = cache.key, cache.value
        else:
            if source is not query:
                k = self._split_heads(self.k_proj(source), self.n_kv_heads)  # (B, Hkv, S, Dk)
                v = self._split_heads(self.v_proj(source), self.n_kv_heads)  # (B, Hkv, S, Dv)
            if cache is not None and cache.static:
                cache.key, cache.value = k, v
            elif cache is not None:
                k, v = cache.append(k, v)
        dropout_p = self.dropout if self.training else 0.0
        if k.size(0) == batch:
            out, weights = attend(q, k, v, mask, causal, dropout_p, need_weights)
        else:
            out, weights = self._attend_shared_source(
                q, k, v, mask, causal, dropout_p, need_weights
            )
        out = out.transpose(1, 2).reshape(batch, t_len, self.n_heads * self.d_v)  # (B, T, H Dv)
        return self.out_proj(out), weights

    def _attend_shared_source(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        causal: bool,
        dropout_p: float,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention where each group of G consecutive query rows shares one source row.

        Beam search's K hypotheses of a sentence attend the same encoder output:
        instead of copying its keys and values K times, the K rows' queries become
        K times more queries of the one row (the same result, one matmul per row).
        q: (B, H, T, Dk); k, v: (B / G, Hkv, S, D); mask broadcastable to (B / G, 1, 1, S).
        """
        batch, heads, t_len, _ = q.shape
        rows = k.size(0)
        if causal or batch % rows != 0 or (mask is not None and mask.size(-2) != 1):
            raise ValueError(
                f"{batch} query rows cannot share {rows} source rows (causal={causal}, "
                f"mask {None if mask is None else tuple(mask.shape)}): only a key mask "
                "over a source shared by equal groups of consecutive rows"
            )
        group = batch // rows
        q = q.view(rows, group, heads, t_len, -1).transpose(1, 2)  # (B/G, H, G, T, Dk)
        q = q.reshape(rows, heads, group * t_len, -1)
        out, weights = attend(q, k, v, mask, False, dropout_p, need_weights)

        def unfold(x: Tensor) -> Tensor:  # (B/G, H, G T, X) -> (B, H, T, X)
            x = x.view(rows, heads, group, t_len, -1).transpose(1, 2)
            return x.reshape(batch, heads, t_len, -1)

        return unfold(out), None if weights is None else unfold(weights)
