"""log_distance: each head penalises a score by the log of the query-key distance,
-scale * m_h * log(1 + |query - key|), with ALiBi's head slopes m_h. Nothing is learned.

Shape legend: H heads, T queries, S keys.
"""

import torch
from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.nn.positions import PositionScheme, register


class LogDistancePositions(PositionScheme):
    """A score bias that falls with the log of the distance (see the module).

    Args:
        n_heads: H.
        scale: multiplies every slope (> 0).

    Raises:
        ValueError: a scale that is not a positive number.
    """

    def __init__(self, n_heads: int, scale: float = 1.0) -> None:
        if isinstance(scale, bool) or not isinstance(scale, int | float) or scale <= 0:
            raise ValueError(f"log_distance's scale must be a positive number, got {scale!r}")
        super().__init__()
        slopes = scale * 2.0 ** (-8.0 * torch.arange(1, n_heads + 1) / n_heads)
        self.register_buffer("slopes", slopes, persistent=False)  # (H,)

    def attention_bias(self, q_len: int, k_len: int) -> Tensor:
        """(H, T, S): the last q_len of k_len positions attending to all k_len."""
        queries = torch.arange(k_len - q_len, k_len, device=self.slopes.device)
        keys = torch.arange(k_len, device=self.slopes.device)
        distance = (queries[:, None] - keys[None, :]).abs().float()  # (T, S)
        return -self.slopes[:, None, None] * torch.log1p(distance)


@register("log_distance", options=("scale",))
def _log_distance(cfg: ModelConfig, causal: bool, scale: float = 1.0) -> PositionScheme:
    return LogDistancePositions(cfg.n_heads, scale)
