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


@dataclass
class LayerKV:
    """Keys and values of one attention sub-layer, kept across decoding steps.

    A `static` store (encoder-decoder attention) is filled once from the encoder
    output; a growing store (decoder self-attention) gets each step's keys and
    values appended.
    """

    static: bool
    key: Tensor | None = None  # (B, Hkv, L, Dk)
    value: Tensor | None = None  # (B, Hkv, L, Dv)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (beam search: follow each hypothesis's parent)."""
        if self.key is not None:
            self.key = self.key.index_select(0, index)
            self.value = self.value.index_select(0, index)


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
        self.q_proj = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * d_k, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * d_v, bias=bias)
        self.out_proj = nn.Linear(n_heads * d_v, d_model, bias=bias)  # W^O: (h d_v) x d_model

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
                `cache` is already filled.
            mask: bool, broadcastable to (B, H, T, S); True = may attend.
            causal: causal self-attention (the decoder's).
            cache: this sub-layer's store for incremental decoding.
            need_weights: also return the (B, H, T, S) attention weights.

        Returns:
            (B, T, D) output and the weights or None.
        """
        batch, t_len, _ = query.shape
        q = self._split_heads(self.q_proj(query), self.n_heads)  # (B, H, T, Dk)
        if cache is not None and cache.static and cache.key is not None:
            k, v = cache.key, cache.value
        else:
            k = self._split_heads(self.k_proj(source), self.n_kv_heads)  # (B, Hkv, S, Dk)
            v = self._split_heads(self.v_proj(source), self.n_kv_heads)  # (B, Hkv, S, Dv)
            if cache is not None:
                if not cache.static and cache.key is not None:
                    k = torch.cat([cache.key, k], dim=2)
                    v = torch.cat([cache.value, v], dim=2)
                cache.key, cache.value = k, v
        dropout_p = self.dropout if self.training else 0.0
        out, weights = attend(q, k, v, mask, causal, dropout_p, need_weights)
        out = out.transpose(1, 2).reshape(batch, t_len, self.n_heads * self.d_v)  # (B, T, H Dv)
        return self.out_proj(out), weights
