"""T5's bucketed relative-position bias (Raffel et al. 2020, "Exploring the Limits of
Transfer Learning with a Unified Text-to-Text Transformer", section 2.1).

Each head learns one scalar per bucket of relative position (key position minus query
position), added to the attention scores. Small distances get a bucket each; larger ones
share logarithmically wider buckets up to max_distance, beyond which all share the last.
The encoder's buckets are bidirectional (earlier and later keys apart); the decoder's,
causal, count only distances to earlier keys.

As in T5, one table serves every layer of a stack: the stack computes the bias once and
adds it in each self-attention layer. T5 does not scale its scores (it folds 1/sqrt(d_k)
into the query initialisation); here the bias is added after the paper's scaling
(equation 1).

Shape legend: H heads, T queries, S keys.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from aiayn.nn.masks import relative_positions
from aiayn.nn.positions.base import PositionScheme, register

if TYPE_CHECKING:
    from aiayn.config import ModelConfig

T5_NUM_BUCKETS = 32
T5_MAX_DISTANCE = 128


def _check_bucketing(num_buckets: int, max_distance: int, bidirectional: bool) -> None:
    buckets_per_side = num_buckets // 2 if bidirectional else num_buckets
    max_exact = buckets_per_side // 2
    if max_exact < 1 or max_distance <= max_exact or (bidirectional and num_buckets % 2):
        raise ValueError(
            "T5's bucketing needs an even num_buckets >= 4 if bidirectional (>= 2 if not) and "
            f"max_distance > the exact range {max_exact}; got num_buckets={num_buckets}, "
            f"max_distance={max_distance}, bidirectional={bidirectional}"
        )


def relative_position_bucket(
    relative_position: Tensor,
    bidirectional: bool,
    num_buckets: int = T5_NUM_BUCKETS,
    max_distance: int = T5_MAX_DISTANCE,
) -> Tensor:
    """T5's bucket of each relative position (Mesh TensorFlow's `_relative_position_bucket`).

    With `bidirectional`, half the buckets are for keys after the query (relative position
    > 0) and half for keys at or before it; otherwise keys after the query all fall in
    bucket 0 (the causal mask hides them) and every bucket counts distances to earlier keys.
    Of each half's n buckets, the first n/2 are exact distances 0 .. n/2 - 1; the others
    split n/2 .. max_distance logarithmically, and farther distances share the last bucket.
    The logarithm is taken in float32, as T5 does, so that bucket boundaries match its
    checkpoints.

    Args:
        relative_position: integer tensor of key position minus query position, any shape.
        bidirectional: separate buckets for keys after the query (an encoder); False for a
            causal decoder.
        num_buckets: the number of buckets in all.
        max_distance: the distance from which on all positions share the last bucket.

    Returns:
        A long tensor of relative_position's shape, values in [0, num_buckets).

    Raises:
        ValueError: if the buckets cannot hold an exact and a logarithmic part.
    """
    _check_bucketing(num_buckets, max_distance, bidirectional)
    buckets_per_side = num_buckets // 2 if bidirectional else num_buckets
    max_exact = buckets_per_side // 2
    relative_position = relative_position.long()
    if bidirectional:
        side = (relative_position > 0).long() * buckets_per_side
        distance = relative_position.abs()
    else:
        side = torch.zeros_like(relative_position)
        distance = (-relative_position).clamp(min=0)  # later keys count as distance 0
    # clamp(min=max_exact) only keeps log(0) out of the branch that torch.where discards
    log_ratio = torch.log(distance.clamp(min=max_exact).float() / max_exact) / math.log(
        max_distance / max_exact
    )
    far = max_exact + (log_ratio * (buckets_per_side - max_exact)).long()
    far = far.clamp(max=buckets_per_side - 1)
    return side + torch.where(distance < max_exact, distance, far)


class RelativePositionBias(PositionScheme):
    """T5's learned relative-position bias on the self-attention scores.

    Adds nothing to the embeddings. The table is initialised from N(0, d_model^-1), as
    Hugging Face's T5 does (`T5PreTrainedModel._init_weights`, factor 1).

    Args:
        n_heads: H, the number of query heads; one scalar per head and bucket.
        d_model: D, only to scale the initialisation.
        bidirectional: separate buckets for earlier and later keys (the encoder); False for
            the decoder's causal self-attention.
        num_buckets: T5's 32.
        max_distance: T5's 128.

    Raises:
        ValueError: if num_buckets and max_distance do not make a valid bucketing.
    """

    def __init__(
        self,
        n_heads: int,
        d_model: int,
        bidirectional: bool,
        num_buckets: int = T5_NUM_BUCKETS,
        max_distance: int = T5_MAX_DISTANCE,
    ) -> None:
        super().__init__()
        _check_bucketing(num_buckets, max_distance, bidirectional)
        self.d_model = d_model
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bias = nn.Embedding(num_buckets, n_heads)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the table from N(0, d_model^-1)."""
        nn.init.normal_(self.bias.weight, std=self.d_model**-0.5)

    def attention_bias(self, q_len: int, k_len: int) -> Tensor:
        """The bias of the last q_len of k_len positions attending to all k_len.

        Returns:
            (H, T, S), the table's dtype and device.

        Raises:
            ValueError: unless 0 <= q_len <= k_len.
        """
        relative = relative_positions(q_len, k_len, self.bias.weight.device)  # (T, S)
        bucket = relative_position_bucket(
            relative, self.bidirectional, self.num_buckets, self.max_distance
        )
        return self.bias(bucket).permute(2, 0, 1)  # (T, S, H) -> (H, T, S)


@register("relative", options=("num_buckets", "max_distance"))
def _relative(
    cfg: ModelConfig,
    causal: bool,
    num_buckets: int = T5_NUM_BUCKETS,
    max_distance: int = T5_MAX_DISTANCE,
) -> PositionScheme:
    for name, value in (("num_buckets", num_buckets), ("max_distance", max_distance)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(
                f"ModelConfig.position_options: relative {name} must be an integer, got {value!r}"
            )
    return RelativePositionBias(
        n_heads=cfg.n_heads,
        d_model=cfg.d_model,
        bidirectional=not causal,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
