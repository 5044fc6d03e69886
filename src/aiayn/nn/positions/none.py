"""No position information at all.

The encoder becomes a bag of words: permuting the source permutes its outputs and
nothing else. A causal decoder still learns order, through its mask: token t sees
exactly t + 1 tokens (Haviv et al. 2022, "Transformer Language Models without
Positional Encodings Still Learn Positional Information").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiayn.nn.positions.base import PositionScheme, register

if TYPE_CHECKING:
    from aiayn.config import ModelConfig


class NoPositions(PositionScheme):
    """Adds nothing, rotates nothing, biases nothing: `PositionScheme`'s defaults."""


@register("none")
def _none(cfg: ModelConfig, causal: bool) -> PositionScheme:
    return NoPositions()
