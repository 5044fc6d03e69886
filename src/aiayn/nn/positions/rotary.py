"""Rotary position embeddings, RoPE (Su et al. 2021, "RoFormer", section 3.2).

Each query and key is split into Dk/2 two-dimensional pairs; pair i at position m is
rotated by the angle m * theta_i, theta_i = 10000^(-2i/Dk). A rotation by m on the query
and by n on the key leaves their dot product a function of the content and of m - n only,
so attention sees relative positions while the cache stores keys rotated once, by their
absolute position.

Pairing: we pair dimension i with dimension i + Dk/2 ("rotate half", as GPT-NeoX, Hugging
Face's LLaMA and flash-attn's default do), not the paper's adjacent (2i, 2i+1). The two are
the same model up to a fixed permutation of the query and key projections' output rows, so
neither is more expressive; rotate-half works on two contiguous halves (no strided views
or reshapes to (..., Dk/2, 2)) and loads rotate-half checkpoints without a permutation.

Shape legend: B batch, H heads, L positions, Dk query/key head size.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from aiayn.nn.positions.base import PositionScheme, check_span, register

if TYPE_CHECKING:
    from aiayn.config import ModelConfig

ROPE_BASE = 10000.0  # RoFormer's, the base of the sinusoids of section 3.5 of the paper


def rotary_angles(n_positions: int, d_k: int, base: float = ROPE_BASE) -> Tensor:
    """The rotation angles m * theta_i, theta_i = base^(-2i/d_k), laid out for rotate-half.

    Computed in float64 so that far positions keep their precision.

    Args:
        n_positions: L, positions m = 0 .. L - 1.
        d_k: Dk, the (even) head size; there are Dk/2 frequencies.
        base: the base of the geometric progression of wavelengths.

    Returns:
        (L, Dk) float64: column i and column i + Dk/2 both hold m * theta_i.
    """
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]
    theta = base ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)  # (Dk/2,)
    angle = position * theta  # (L, Dk/2)
    return torch.cat([angle, angle], dim=-1)  # (L, Dk)


class RotaryPositions(PositionScheme):
    """Rotary position embeddings on self-attention queries and keys (RoFormer).

    Adds nothing to the embeddings. The cos/sin tables are buffers, not saved; the
    rotation is computed in float32 and returned in the input's dtype.

    Args:
        d_k: Dk, the query/key head size; must be even.
        max_len: the number of positions tabulated.
        base: the base of theta_i = base^(-2i/d_k); RoFormer's 10000.

    Raises:
        ValueError: if d_k is odd, or base is not a finite number above 1.
    """

    rotary = True

    def __init__(self, d_k: int, max_len: int, base: float = ROPE_BASE) -> None:
        super().__init__()
        if d_k % 2 != 0:
            raise ValueError(
                f"rotary positions rotate pairs of dimensions: d_k must be even, got {d_k}"
            )
        if isinstance(base, bool) or not isinstance(base, int | float) or not 1 < base < math.inf:
            raise ValueError(f"rotary base must be a finite number above 1, got {base!r}")
        self.d_k = d_k
        self.max_len = max_len
        angle = rotary_angles(max_len, d_k, base)
        self.register_buffer("cos", torch.cos(angle).float(), persistent=False)
        self.register_buffer("sin", torch.sin(angle).float(), persistent=False)

    def rotate(self, x: Tensor, offset: int = 0) -> Tensor:
        """Rotate each (i, i + Dk/2) pair of x's rows by position * theta_i.

        Args:
            x: (B, H, L, Dk) queries or keys at positions offset .. offset + L - 1
                (any number of heads: grouped key/value heads work alike).
            offset: the position of x's first row.

        Returns:
            (B, H, L, Dk), x's dtype.

        Raises:
            ValueError: if x's last dimension is not d_k, or the positions run past max_len.
        """
        if x.shape[-1] != self.d_k:
            raise ValueError(
                f"RotaryPositions was built for d_k={self.d_k}, got x of shape {tuple(x.shape)}"
            )
        length = x.shape[-2]
        check_span(length, offset, self.max_len, type(self).__name__)
        cos = self.cos[offset : offset + length].float()  # (L, Dk), broadcast over B, H
        sin = self.sin[offset : offset + length].float()
        x32 = x.float()
        first, second = x32.chunk(2, dim=-1)
        half_turned = torch.cat([-second, first], dim=-1)  # (a, b) -> (-b, a) on each pair
        return (x32 * cos + half_turned * sin).to(x.dtype)


@register("rotary", options=("base",))
def _rotary(cfg: ModelConfig, causal: bool, base: float = ROPE_BASE) -> PositionScheme:
    return RotaryPositions(d_k=cfg.d_k, max_len=cfg.max_len, base=base)
