"""ALiBi, attention with linear biases (Press et al. 2022, "Train Short, Test Long").

No position is added to the embeddings; instead each head h penalises a query's score
for a key linearly in their distance, -m_h * (query position - key position), with a
fixed, head-specific slope m_h (section 3). Nothing is learned.

Deviation: the paper defines ALiBi only for causal language models. For the
bidirectional encoder we use the symmetric form -m_h * |query position - key position|,
so that later keys are penalised like earlier ones at the same distance.

Shape legend: H heads, T queries, S keys.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from aiayn.nn.masks import relative_positions
from aiayn.nn.positions.base import PositionScheme, register

if TYPE_CHECKING:
    from aiayn.config import ModelConfig

ALIBI_SLOPE_SPAN = 8  # for n heads (a power of two) the slopes run 2^(-8/n) .. 2^-8


def alibi_slopes(n_heads: int) -> list[float]:
    """The head-specific slopes m_1 .. m_n of the paper (section 3 and its reference code).

    For n a power of two, m_h = 2^(-8h/n), h = 1 .. n: a geometric sequence from 2^(-8/n)
    down to 2^-8. For other n, the slopes of the closest lower power of two 2^k, followed
    by every other slope of 2^(k+1), the first n - 2^k of them.

    Args:
        n_heads: n, the number of heads.

    Returns:
        n slopes, as exact floats (powers of two for a power-of-two n).

    Raises:
        ValueError: if n_heads < 1.
    """
    if n_heads < 1:
        raise ValueError(f"alibi_slopes needs at least one head, got n_heads={n_heads}")
    if n_heads & (n_heads - 1) == 0:
        return [2.0 ** (-ALIBI_SLOPE_SPAN * h / n_heads) for h in range(1, n_heads + 1)]
    lower = 2 ** math.floor(math.log2(n_heads))
    return alibi_slopes(lower) + alibi_slopes(2 * lower)[0::2][: n_heads - lower]


class ALiBiPositions(PositionScheme):
    """Linear distance penalties on the self-attention scores (ALiBi).

    Args:
        n_heads: H, the number of query heads; head h gets slope `alibi_slopes(H)[h]`.
        causal: True for the decoder's causal self-attention (the paper's form); False for
            the encoder, which gets the symmetric form (a deviation, see the module).
    """

    def __init__(self, n_heads: int, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        slopes = torch.tensor(alibi_slopes(n_heads), dtype=torch.float32)
        self.register_buffer("slopes", slopes, persistent=False)  # (H,)

    def attention_bias(self, q_len: int, k_len: int) -> Tensor:
        """The bias of the last q_len of k_len positions attending to all k_len.

        Causal: -m_h * (query - key) for keys at or before the query, and 0 for later keys
        (the causal mask removes them; 0 keeps the bias finite and never positive).
        Bidirectional: -m_h * |query - key|.

        Returns:
            (H, T, S) float32, on the slopes' device.

        Raises:
            ValueError: unless 0 <= q_len <= k_len.
        """
        key_minus_query = relative_positions(q_len, k_len, self.slopes.device)  # (T, S)
        distance = (-key_minus_query).clamp(min=0) if self.causal else key_minus_query.abs()
        return self.slopes[:, None, None] * (-distance).to(self.slopes.dtype)  # (H, T, S)


@register("alibi")
def _alibi(cfg: ModelConfig, causal: bool) -> PositionScheme:
    return ALiBiPositions(n_heads=cfg.n_heads, causal=causal)
