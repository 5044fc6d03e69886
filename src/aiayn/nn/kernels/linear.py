"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"), section 3.2.

softmax(q k^T) is replaced by the kernel phi(q) phi(k)^T with phi(x) = elu(x) + 1, so

    out_i = phi(q_i)^T S / phi(q_i)^T z,   S = sum_j phi(k_j) v_j^T,   z = sum_j phi(k_j)

and the (T, S) score matrix is never formed: time and memory grow linearly with length.
Causal attention takes the sums over j <= i (their eq. 8-9), a chunk of `CHUNK`
positions at a time (`causal_sums`, which Performer shares), and
incremental decoding keeps only S and z (`LinearAttentionState`): constant memory
per step, the recurrent form of their section 3.4.

Shape legend: B batch, H query heads, Hkv key/value heads, T queries, S keys (the
queries are the last T of the S positions), Dk query/key head size, Dv value head size.

Departures: no score bias (relative positions, ALiBi) and no attention dropout, since
there are no scores; a key-padding mask only, (B, 1, 1, S). The weights, when asked
for, are the normalised phi(q_i) . phi(k_j), computed explicitly (O(T S)) for drawing.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.nn.kernels import KERNELS, CacheKind, Kernel, expand_kv


def feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1: positive, so every normaliser phi(q) . sum phi(k) is > 0."""
    return F.elu(x) + 1.0


def _heads(q: Tensor, x: Tensor) -> Tensor:
    """(B, Hkv, L, D) -> (B, H, L, D): each key/value head serves H / Hkv query heads."""
    return x.repeat_interleave(q.size(1) // x.size(1), dim=1) if x.size(1) != q.size(1) else x


def _key_rows(mask: Tensor | None, s_len: int, kernel: str = "linear") -> Tensor | None:
    """A key-padding mask (B, 1, 1, S) as (B, 1, S, 1) bools (True = a real key), or None;
    `kernel` names the attention in the error of a mask of another shape."""
    if mask is None:
        return None
    if mask.dim() != 4 or mask.size(-2) != 1 or mask.size(-1) != s_len:
        raise ValueError(
            f"{kernel} attention takes a key mask (B, 1, 1, S={s_len}), got {tuple(mask.shape)}"
        )
    return mask[:, :, 0, :, None]


def _divide(numerator: Tensor, normaliser: Tensor) -> Tensor:
    """numerator / normaliser, with 0 where no key was seen (a fully padded row)."""
    safe = torch.where(normaliser > 0, normaliser, torch.ones_like(normaliser))
    return torch.where(normaliser > 0, numerator / safe, torch.zeros_like(numerator))


# Positions per chunk of the causal form: the (C, C) products inside a chunk cost T C,
# the chunks' sums T m Dv / C; 64 balances them for m Dv around 4,096.
CHUNK = 64


def causal_sums(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    sums: Tensor | None = None,
    normaliser: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Causal attention by features: out_i = phi(q_i)^T S_i / phi(q_i)^T z_i with S_i, z_i
    summed over keys j <= i (and the earlier positions' `sums` and `normaliser`), chunk by
    chunk (`CHUNK` positions): within a chunk the (C, C) feature products are masked,
    and the chunks before it enter through their summed S and z.

    Args:
        phi_q: (B, H, T, m) query features; phi_k: (B, H, T, m) key features (0 at padding).
        v: (B, H, T, Dv) values.
        sums: (B, H, m, Dv) S of the positions before these, or None.
        normaliser: (B, H, m) z of those positions, or None.

    Returns:
        (B, H, T, Dv) outputs, and S and z over all positions so far.
    """
    batch, heads, t_len, m = phi_q.shape
    d_v = v.size(-1)
    chunk = max(1, min(CHUNK, t_len))
    n = math.ceil(t_len / chunk)
    pad = n * chunk - t_len  # zero features at the end: they add nothing
    q = F.pad(phi_q, (0, 0, 0, pad)).view(batch, heads, n, chunk, m)
    k = F.pad(phi_k, (0, 0, 0, pad)).view(batch, heads, n, chunk, m)
    values = F.pad(v, (0, 0, 0, pad)).view(batch, heads, n, chunk, d_v)
    local = (q @ k.transpose(-2, -1)).tril()  # (B, H, n, C, C): j <= i within a chunk
    chunk_sums = k.transpose(-2, -1) @ values  # (B, H, n, m, Dv)
    chunk_normalisers = k.sum(dim=-2)  # (B, H, n, m)
    if sums is None:
        sums = phi_q.new_zeros(batch, heads, m, d_v)
        normaliser = phi_q.new_zeros(batch, heads, m)
    # S and z of everything before each chunk: earlier calls', then earlier chunks'
    before = torch.cat([sums[:, :, None], chunk_sums[:, :, :-1]], dim=2).cumsum(dim=2)
    before_z = torch.cat([normaliser[:, :, None], chunk_normalisers[:, :, :-1]], dim=2)
    before_z = before_z.cumsum(dim=2)  # (B, H, n, m)
    numerator = local @ values + q @ before  # (B, H, n, C, Dv)
    denominator = local.sum(dim=-1, keepdim=True) + q @ before_z[..., None]  # (B, H, n, C, 1)
    out = _divide(numerator, denominator).view(batch, heads, n * chunk, d_v)[:, :, :t_len]
    return (
        out,
        before[:, :, -1] + chunk_sums[:, :, -1],
        before_z[:, :, -1] + chunk_normalisers[:, :, -1],
    )


def feature_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """Attention by features, full or causal: out_i = phi(q_i)^T S / phi(q_i)^T z over
    every key, or (causal) over keys j <= i, where query i stands at position S - T + i.

    Args:
        phi_q: (B, H, T, m) query features; phi_k: (B, H, S, m) key features (0 at
            padding); v: (B, H, S, Dv) values.

    Returns:
        (B, H, T, Dv) outputs.
    """
    if not causal:
        sums = phi_k.transpose(-2, -1) @ v  # (B, H, m, Dv)
        return _divide(phi_q @ sums, phi_q @ phi_k.sum(-2)[..., None])
    # the S - T earlier positions enter as one sum, then `causal_sums`' chunks
    early = phi_k.size(-2) - phi_q.size(-2)
    sums = phi_k[:, :, :early].transpose(-2, -1) @ v[:, :, :early]  # (B, H, m, Dv)
    normaliser = phi_k[:, :, :early].sum(-2)  # (B, H, m)
    out, _, _ = causal_sums(phi_q, phi_k[:, :, early:], v[:, :, early:], sums, normaliser)
    return out


class LinearAttentionState:
    """What causal linear attention keeps of the past: S = sum phi(k) v^T and z = sum phi(k)
    per key/value head, and how many positions they sum. Its size does not grow."""

    static = False  # a growing store, as `MultiHeadAttention` tells them apart

    def __init__(self) -> None:
        self.sums: Tensor | None = None  # S: (B, Hkv, Dk, Dv)
        self.normaliser: Tensor | None = None  # z: (B, Hkv, Dk)
        self.length = 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (beam search: follow each hypothesis's parent)."""
        if self.sums is not None:
            self.sums = self.sums.index_select(0, index)
            self.normaliser = self.normaliser.index_select(0, index)


@KERNELS.register("linear")
class LinearAttentionKernel(Kernel):
    """elu + 1 linear attention: full and causal forms, cached decoding as a recurrent state."""

    takes_bias = False
    takes_full_mask = False
    full_scores = False
    cache = CacheKind.STATE

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
        refuse_scores("linear", bias, dropout_p)
        s_len = k.size(-2)
        phi_q = feature_map(q)  # (B, H, T, Dk)
        phi_k, v = _heads(q, feature_map(k)), _heads(q, v)  # (B, H, S, D)
        keys = _key_rows(mask, s_len)
        if keys is not None:  # padded keys add nothing to S or z
            phi_k = phi_k * keys
        out = feature_attention(phi_q, phi_k, v, causal)  # (B, H, T, Dv)
        weights = self._weights(phi_q, phi_k, causal) if need_weights else None
        return out.to(q.dtype), weights

    def new_cache(self) -> LinearAttentionState:
        return LinearAttentionState()

    def attend_cached(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cache: LinearAttentionState,
        mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        bias: Tensor | None = None,
        kv_of_head: tuple[int, ...] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Add this step's keys and values to S and z, then attend from them (causal)."""
        refuse_scores("linear", bias, 0.0, cached_weights=need_weights)
        t_len = q.size(-2)
        phi_k = feature_map(k)  # (B, Hkv, T, Dk)
        keys = None if mask is None else _key_rows(mask, cache.length + t_len)
        if keys is not None:  # the new keys' own columns of the mask
            phi_k = phi_k * keys[:, :, -t_len:]
        steps = torch.cumsum(phi_k[..., :, None] * v[..., None, :], dim=2)  # (B, Hkv, T, Dk, Dv)
        normalisers = torch.cumsum(phi_k, dim=2)  # (B, Hkv, T, Dk)
        if cache.sums is not None:
            steps = steps + cache.sums[:, :, None]
            normalisers = normalisers + cache.normaliser[:, :, None]
        cache.sums, cache.normaliser = steps[:, :, -1], normalisers[:, :, -1]
        cache.length += t_len
        # each query head reads its key/value head's sums: (B, H, T, Dk, Dv) and (B, H, T, Dk)
        steps, normalisers = self._per_query_head(q, steps, normalisers, kv_of_head)
        phi_q = feature_map(q)  # (B, H, T, Dk)
        numerator = (phi_q[..., None, :] @ steps).squeeze(-2)  # (B, H, T, Dv)
        out = _divide(numerator, (phi_q * normalisers).sum(-1, keepdim=True))
        return out.to(q.dtype), None

    @staticmethod
    def _per_query_head(
        q: Tensor, steps: Tensor, normalisers: Tensor, kv_of_head: tuple[int, ...] | None
    ) -> tuple[Tensor, Tensor]:
        if kv_of_head is not None:  # irregular groups (pruned heads): one index per head
            return expand_kv(steps, normalisers, kv_of_head)
        return _heads(q, steps), _heads(q, normalisers)

    @staticmethod
    def _weights(phi_q: Tensor, phi_k: Tensor, causal: bool) -> Tensor:
        """The implicit weights phi(q_i) . phi(k_j) / sum_j', (B, H, T, S), for drawing."""
        scores = phi_q @ phi_k.transpose(-2, -1)  # (B, H, T, S), >= 0; padded keys are 0
        if causal:
            t_len, s_len = scores.shape[-2:]
            allowed = torch.ones(t_len, s_len, dtype=torch.bool, device=scores.device)
            scores = scores * allowed.tril(diagonal=s_len - t_len)
        return _divide(scores, scores.sum(-1, keepdim=True))


def refuse_scores(
    kernel: str, bias: Tensor | None, dropout_p: float, cached_weights: bool = False
) -> None:
    """What a kernel that forms no scores refuses, naming it: a score bias, attention
    dropout and, while decoding from its recurrent state, the weights (it keeps no keys).

    Raises:
        ValueError: one of them was asked for.
    """
    if bias is not None:
        raise ValueError(f"{kernel} attention takes no score bias (it forms no scores)")
    if dropout_p > 0:
        raise ValueError(
            f"{kernel} attention forms no weights to drop: set ModelConfig.attention_dropout 0"
        )
    if cached_weights:
        raise ValueError(
            f"{kernel} attention keeps no keys while decoding: its weights exist only for a "
            "whole sequence (attention_maps)"
        )
