"""Fixed sinusoidal position encodings (section 3.5), in the paper's layout and Marian's.

Shape legend: L positions, D d_model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from aiayn.nn.positions.base import PositionScheme, check_span, register

if TYPE_CHECKING:
    from aiayn.config import ModelConfig


def sinusoidal_table(n_positions: int, d_model: int, halves: bool = False) -> Tensor:
    """The paper's sinusoids, interleaved: even dimensions sine, odd dimensions cosine.

    PE(pos, 2i) = sin(pos / 10000^(2i / d_model)),
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model)).

    With `halves`, the same values are laid out as Marian (and tensor2tensor) do:
    all sines in the first ceil(d_model / 2) dimensions, the cosines after them.

    Computed in float64 and rounded once to float32, so that far positions keep their precision.

    Args:
        n_positions: L, positions 0 .. L - 1.
        d_model: D, the width of each encoding (an odd width keeps the last sine).
        halves: Marian's layout instead of the paper's.

    Returns:
        (L, D) float32.
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


class SinusoidalPositions(PositionScheme):
    """Fixed sinusoidal encodings added to the embeddings (section 3.5).

    The table is a buffer, not a parameter, and is not saved: it follows from the formula.

    Args:
        max_len: the number of positions tabulated.
        d_model: D, the embedding width.
        halves: Marian's layout (all sines, then all cosines) instead of the paper's.
    """

    def __init__(self, max_len: int, d_model: int, halves: bool = False) -> None:
        super().__init__()
        self.max_len = max_len
        self.register_buffer("table", sinusoidal_table(max_len, d_model, halves), persistent=False)

    def embeddings(self, length: int, offset: int = 0) -> Tensor:
        """Encodings of positions offset .. offset + length - 1: (L, D).

        Raises:
            ValueError: if the positions run past max_len.
        """
        check_span(length, offset, self.max_len, type(self).__name__)
        return self.table[offset : offset + length]


@register("sinusoidal")
def _sinusoidal(cfg: ModelConfig, causal: bool) -> PositionScheme:
    return SinusoidalPositions(max_len=cfg.max_len, d_model=cfg.d_model)


@register("sinusoidal_halves")
def _sinusoidal_halves(cfg: ModelConfig, causal: bool) -> PositionScheme:
    return SinusoidalPositions(max_len=cfg.max_len, d_model=cfg.d_model, halves=True)
