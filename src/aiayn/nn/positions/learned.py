"""Learned absolute positions: one trained vector per position (Table 3, row E).

Shape legend: L positions, D d_model.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from aiayn.nn.positions.base import PositionScheme, check_span, register

if TYPE_CHECKING:
    from aiayn.config import ModelConfig


class LearnedPositions(PositionScheme):
    """One learned vector per position, added to the embeddings (Table 3, row E).

    The paper does not say how it initialised them; we draw from N(0, 1/d_model), as the
    token embeddings are drawn (before their sqrt(d_model) scaling).

    Args:
        max_len: the number of positions, hence rows of `weight`.
        d_model: D, the embedding width.
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw `weight` from N(0, 1/d_model)."""
        nn.init.normal_(self.weight, std=1 / math.sqrt(self.weight.shape[1]))

    def embeddings(self, length: int, offset: int = 0) -> Tensor:
        """Vectors of positions offset .. offset + length - 1: (L, D).

        Raises:
            ValueError: if the positions run past max_len.
        """
        check_span(length, offset, self.max_len, type(self).__name__)
        return self.weight[offset : offset + length]


@register("learned")
def _learned(cfg: ModelConfig, causal: bool) -> PositionScheme:
    return LearnedPositions(max_len=cfg.max_len, d_model=cfg.d_model)
