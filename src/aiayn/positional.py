"""Position information added to the token embeddings (section 3.5).

Shape legend: L positions, D d_model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(n_positions: int, d_model: int, halves: bool = False) -> Tensor:
    """The paper's sinusoids, interleaved: even dimensions sine, odd dimensions cosine.

    PE(pos, 2i) = sin(pos / 10000^(2i / d_model)),
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model)).

    With `halves`, the same values are laid out as Marian (and tensor2tensor) do:
    all sines in the first ceil(d_model / 2) dimensions, the cosines after them.

    Returns:
        (n_positions, d_model) float32.
    """
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = position / torch.pow(10000.0, two_i / d_model)  # (L, ceil(D/2))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    if halves:
        table = torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)
    return table.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings; a buffer, not a parameter, and not saved."""

    def __init__(self, max_len: int, d_model: int, halves: bool = False) -> None:
        super().__init__()
        table = sinusoidal_table(max_len, d_model, halves)
        self.register_buffer("table", table, persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Encodings of positions offset .. offset + length - 1: (L, D)."""
        return self.table[offset : offset + length]


class LearnedPositions(nn.Module):
    """One learned vector per position (Table 3, row E)."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=1 / math.sqrt(d_model))

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Vectors of positions offset .. offset + length - 1: (L, D)."""
        return self.weight[offset : offset + length]
