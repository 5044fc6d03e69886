"""Performer attention (Choromanski et al. 2021, "Rethinking Attention with Performers"): FAVOR+.

The softmax kernel exp(q . k / sqrt(Dk)) is estimated by positive random features
(their Lemma 1): with x' = x / Dk^(1/4) and m random directions w_1 ... w_m,

    phi(x) = exp(-|x'|^2 / 2) / sqrt(m) * [exp(w_1 . x'), ..., exp(w_m . x')]
    E[phi(q) . phi(k)] = exp(q . k / sqrt(Dk))

so that, as in linear attention,

    out_i = phi(q_i)^T S / phi(q_i)^T z,   S = sum_j phi(k_j) v_j^T,   z = sum_j phi(k_j)

and the (T, S) score matrix is never formed. The directions are orthogonal (section 2.4:
blocks of Dk orthogonal rows, each row rescaled to the norm of a Gaussian vector, so each
row is still distributed as N(0, I)), which lowers the estimate's variance. Each block is
uniformly (Haar) distributed with `uniform_directions=True`: Q of the QR split with its
columns multiplied by the signs of R's diagonal (Mezzadri 2007). Without the signs, as
aiayn drew them before issue 46, the blocks are not uniform and the kernel estimate stops
improving near 4% relative error however many features there are
(tests/unit/test_performer_features.py); a config without the option is one written
before it existed, and rebuilds those old directions bit for bit. They are a
buffer of the kernel, saved with the model, so a reloaded model computes the same
attention; during training they are redrawn every `redraw_interval` calls (section 4.2's
feature redrawing), and never in evaluation. Each draw comes from the layer's own seed
(drawn when it is built, a buffer too) and its call count, so the processes of a
distributed run, and a resumed run, draw the same directions.

Causal attention takes the sums over j <= i, a chunk of `CHUNK` positions at a time:
within a chunk the (chunk, chunk) feature products are masked explicitly, and the chunks
before it enter through their summed S and z (prefix sums over chunks). Memory is
linear in T (about T (CHUNK + m Dv / CHUNK) per head) rather than the T m Dv of a prefix
sum per position. Incremental decoding keeps only S and z (`PerformerState`): constant
memory per step, as linear attention's recurrent form.

Numerical stability: the features are exponentials, so each query's are divided by their
largest value (a factor that cancels in out_i), and the keys' by the largest over all
keys seen (one factor per batch row and head, so it cancels as well; the decoding state
rescales its sums when a later key raises it, as an online softmax does).
With one offset for all keys, a key whose features are below e^-87 times the largest
ones (float32) counts for nothing; causally, an early query that sees only such keys then
gets a zero output. The paper's implementation shares this limit (and adds a small
constant to every feature, which we do not: the estimate stays the definition's).

Shape legend: B batch, H query heads, Hkv key/value heads, T queries, S keys (the
queries are the last T of the S positions), Dk query/key head size, Dv value head size,
m random features, n chunks of C positions.

Departures: no score bias (relative positions, ALiBi) and no attention dropout, since
there are no scores; a key-padding mask only, (B, 1, 1, S). One set of directions per
layer, shared by its heads (as the paper's implementation). Redrawing counts the
kernel's calls in training mode (one per forward pass), not optimiser steps. The
weights, when asked for, are the normalised phi(q_i) . phi(k_j), computed explicitly
(O(T S)) for drawing. The decoding state is kept per query head (H, not Hkv).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from aiayn.nn.kernels import KERNELS, CacheKind, Kernel, expand_kv

# the same form as linear attention: its helpers
from aiayn.nn.kernels.linear import (
    LinearAttentionKernel,
    _heads,
    _key_rows,
    causal_sums,
    feature_attention,
    refuse_scores,
)

if TYPE_CHECKING:
    from aiayn.config import ModelConfig


def orthogonal_features(
    num_features: int,
    d_k: int,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
    uniform: bool = False,
) -> Tensor:
    """m random directions for FAVOR+: blocks of Dk orthogonal rows (the last block cut),
    each row rescaled to the length of an independent N(0, I_Dk) vector.

    Args:
        num_features: m >= 1.
        d_k: Dk >= 1, the query/key head size.
        generator: the random source (default: torch's global one).
        device: where to make them.
        uniform: multiply Q's columns by the signs of R's diagonal, which makes each
            block uniformly (Haar) distributed over the orthogonal matrices (Mezzadri
            2007); False: Q as `torch.linalg.qr` returns it, aiayn's draw before issue
            46 (not uniform: the estimate stalls near 4% error). Both draw the same
            random numbers, so only the signs differ.

    Returns:
        (m, Dk) float32.
    """
    blocks = []
    for _ in range(math.ceil(num_features / d_k)):
        gaussian = torch.randn(d_k, d_k, generator=generator)
        orthonormal, upper = torch.linalg.qr(gaussian)  # its columns are orthonormal
        if uniform:
            orthonormal = orthonormal * torch.sign(torch.diagonal(upper))
        blocks.append(orthonormal.T)
    rows = torch.cat(blocks)[:num_features]  # (m, Dk), orthonormal within each block
    lengths = torch.randn(num_features, d_k, generator=generator).norm(dim=1, keepdim=True)
    return (rows * lengths).to(device)


def _key_offset(log_k: Tensor, keys: Tensor | None) -> Tensor:
    """The largest log-feature of the real keys, (B, H, 1, 1), detached (it cancels); 0
    where there is no real key."""
    if keys is not None:
        log_k = log_k.masked_fill(~keys, float("-inf"))
    largest = log_k.detach().amax(dim=(-2, -1), keepdim=True)
    return torch.where(torch.isfinite(largest), largest, torch.zeros_like(largest))


class PerformerState:
    """What causal Performer attention keeps of the past: S = sum phi(k) v^T and
    z = sum phi(k) per query head, scaled by exp(-offset) (the largest key log-feature
    seen), and how many positions they sum. Its size does not grow."""

    static = False  # a growing store, as `MultiHeadAttention` tells them apart

    def __init__(self) -> None:
        self.sums: Tensor | None = None  # S: (B, H, m, Dv)
        self.normaliser: Tensor | None = None  # z: (B, H, m)
        self.offset: Tensor | None = None  # (B, H, 1, 1)
        self.length = 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (beam search: follow each hypothesis's parent)."""
        if self.sums is not None:
            self.sums = self.sums.index_select(0, index)
            self.normaliser = self.normaliser.index_select(0, index)
            self.offset = self.offset.index_select(0, index)


@KERNELS.register("performer")
class PerformerKernel(Kernel, nn.Module):
    """FAVOR+ attention: full and causal forms, cached decoding as a recurrent state.

    An `nn.Module` as well as a kernel, so that its random directions (`projection`, a
    buffer) and its call count are saved with the model and follow it across devices.

    Args:
        d_k: query/key head size Dk.
        num_features: m >= 1 random features (the paper's experiments: a few hundred;
            more gives a closer estimate of softmax attention at a linear cost).
        redraw_interval: redraw the directions every this many calls in training mode
            (>= 1), or None never to redraw.
        uniform_directions: draw uniformly distributed orthogonal blocks (True; what a
            new model should ask for), or the signs as `torch.linalg.qr` leaves them
            (False, the default: what every config written before the option means, so
            a saved run redraws the directions it trained with).

    Raises:
        ValueError: an option out of range, naming it (`ModelConfig.attention_options`).
    """

    takes_bias = False
    takes_full_mask = False
    full_scores = False
    cache = CacheKind.STATE
    options = ("num_features", "redraw_interval", "uniform_directions")

    def __init__(
        self,
        d_k: int,
        num_features: int = 256,
        redraw_interval: int | None = 1000,
        uniform_directions: bool = False,
    ) -> None:
        for name, value in (("num_features", num_features), ("redraw_interval", redraw_interval)):
            if value is None and name == "redraw_interval":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                never = " or None (never redraw)" if name == "redraw_interval" else ""
                raise ValueError(
                    f"ModelConfig.attention_options: performer's {name} must be an integer "
                    f">= 1{never}, got {value!r}"
                )
        if not isinstance(uniform_directions, bool):
            raise ValueError(
                "ModelConfig.attention_options: performer's uniform_directions must be true "
                f"or false, got {uniform_directions!r}"
            )
        nn.Module.__init__(self)
        self.d_k, self.num_features, self.redraw_interval = d_k, num_features, redraw_interval
        self.uniform_directions = uniform_directions
        # The directions follow from a seed and the calls so far: every process of a
        # distributed run redraws the same ones, whatever its own random state.
        self.register_buffer("seed", torch.randint(2**31, (), dtype=torch.long))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("projection", self._draw())  # (m, Dk)

    @classmethod
    def from_config(cls, cfg: ModelConfig, **options: Any) -> PerformerKernel:
        return cls(cfg.d_k, **options)

    def __repr__(self) -> str:
        return (
            f"PerformerKernel(num_features={self.num_features}, "
            f"redraw_interval={self.redraw_interval}, "
            f"uniform_directions={self.uniform_directions})"
        )

    def _log_features(self, x: Tensor) -> Tensor:
        """log phi(x): w . x' - |x'|^2 / 2 - log sqrt(m), (B, H, L, m)."""
        x = x * self.d_k**-0.25  # x' = x / Dk^(1/4)
        projected = x @ self.projection.to(x.dtype).T  # (B, H, L, m)
        return projected - (x * x).sum(-1, keepdim=True) / 2 - math.log(self.num_features) / 2

    def _query_features(self, q: Tensor) -> Tensor:
        """phi(q) divided by its largest entry (which cancels in each output), (B, H, T, m)."""
        log_q = self._log_features(q)
        return (log_q - log_q.detach().amax(dim=-1, keepdim=True)).exp()

    def _maybe_redraw(self) -> None:
        """Count a training call; every `redraw_interval` of them, new directions."""
        if not self.training or self.redraw_interval is None:
            return
        self.calls += 1
        if int(self.calls) % self.redraw_interval == 0:
            fresh = self._draw().to(self.projection.device, self.projection.dtype)
            self.projection = fresh  # a new tensor: no in-place edit of one autograd saved

    def _draw(self) -> Tensor:
        """The directions for this seed and call count, (m, Dk) float32 on the CPU."""
        generator = torch.Generator().manual_seed(int(self.seed) + int(self.calls))
        return orthogonal_features(
            self.num_features, self.d_k, generator, uniform=self.uniform_directions
        )

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
        refuse_scores("performer", bias, dropout_p)
        self._maybe_redraw()
        t_len, s_len = q.size(-2), k.size(-2)
        if t_len > s_len:
            raise ValueError(
                f"more queries than keys: T={t_len} > S={s_len} (the queries are the last T "
                "of the S positions)"
            )
        k, v = _heads(q, k), _heads(q, v)  # (B, H, S, D)
        keys = _key_rows(mask, s_len, "performer")
        log_k = self._log_features(k)  # (B, H, S, m)
        phi_k = (log_k - _key_offset(log_k, keys)).exp()
        if keys is not None:  # padded keys add nothing to S or z
            phi_k = phi_k * keys
        phi_q = self._query_features(q)  # (B, H, T, m)
        out = feature_attention(phi_q, phi_k, v, causal)  # (B, H, T, Dv)
        weights = LinearAttentionKernel._weights(phi_q, phi_k, causal) if need_weights else None
        return out.to(q.dtype), weights

    def new_cache(self) -> PerformerState:
        return PerformerState()

    def attend_cached(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cache: PerformerState,
        mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        bias: Tensor | None = None,
        kv_of_head: tuple[int, ...] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Add this step's keys and values to S and z, then attend from them (causal)."""
        refuse_scores("performer", bias, 0.0, cached_weights=need_weights)
        t_len = q.size(-2)
        k, v = expand_kv(k, v, kv_of_head)
        k, v = _heads(q, k), _heads(q, v)  # (B, H, T, D)
        keys = _key_rows(mask, cache.length + t_len, "performer")
        keys = None if keys is None else keys[:, :, -t_len:]  # the new keys' own columns
        log_k = self._log_features(k)  # (B, H, T, m)
        offset = _key_offset(log_k, keys)
        sums, normaliser = cache.sums, cache.normaliser
        if cache.offset is not None:  # one offset for old and new keys: the larger
            offset = torch.maximum(offset, cache.offset)
            rescale = (cache.offset - offset).exp()  # <= 1, (B, H, 1, 1)
            sums, normaliser = sums * rescale, normaliser * rescale[..., 0]
        phi_k = (log_k - offset).exp()
        if keys is not None:
            phi_k = phi_k * keys
        out, cache.sums, cache.normaliser = causal_sums(
            self._query_features(q), phi_k, v, sums, normaliser
        )
        cache.offset, cache.length = offset, cache.length + t_len
        return out.to(q.dtype), None
