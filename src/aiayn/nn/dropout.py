"""Dropout (section 5.4) with a faster random mask on the CPU.

On the CPU `torch.nn.functional.dropout` draws its mask with `bernoulli_`, one
double-precision uniform per element. Here every 64-bit word of the generator
yields three 16-bit uniforms and an element is kept when its uniform is at least
the threshold (the speed against `F.dropout`: benchmarks/bench_kernels.py,
results/kernels.json).

The drop probability becomes round(p * 65536) / 65536 (0.1 -> 0.100006) and
kept elements are scaled by the inverse of the exact keep probability, so the
expectation of the output is still the input. Masks come from PyTorch's global
generator: `torch.manual_seed` and saved RNG states reproduce them. Other devices
(CUDA's dropout is already fast) and code compiled by `torch.compile` keep `F.dropout`.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LEVELS = 1 << 16  # resolution of the drop probability
_THREE_UNIFORMS = sys.byteorder == "little"  # the low three 16-bit chunks of each word


def _dropped_levels(p: float) -> int:
    """p in units of 2^-16, rounded: the mask drops with probability this / 2^16."""
    return round(p * _LEVELS)


def drop_probability(p: float) -> float:
    """The probability the CPU mask actually drops with: p rounded to a multiple of 2^-16."""
    return _dropped_levels(p) / _LEVELS


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> Tensor:
    """A bool CPU tensor, True with probability 1 - drop_probability(p) at each element."""
    n = math.prod(shape)
    words = torch.empty((n + 2) // 3, dtype=torch.int64).random_()  # 63 random bits each
    uniforms = words.view(torch.int16).view(-1, 4)[:, :3]  # each in [-32768, 32767]
    threshold = _dropped_levels(p) - _LEVELS // 2
    return (uniforms >= threshold).view(-1)[:n].view(shape)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element with probability p and scale the rest by 1 / (1 - p) (in training)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not _THREE_UNIFORMS or p >= 1.0 or torch.compiler.is_compiling():
        # Under torch.compile the compiler draws its own masks (in-place random_ would
        # break the graph); CUDA's dropout is already fast.
        return F.dropout(x, p, training=True)
    dropped = _dropped_levels(p)
    if dropped == 0:
        return x
    return (x * keep_mask(x.shape, p)).mul_(_LEVELS / (_LEVELS - dropped))


class Dropout(nn.Module):
    """`nn.Dropout` through `dropout` above (same argument, same train/eval behaviour)."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must lie in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
