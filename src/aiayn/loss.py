"""Label-smoothed cross-entropy (section 5.4).

"During training, we employed label smoothing of value epsilon_ls = 0.1. This hurts
perplexity, as the model learns to be more unsure, but improves accuracy and BLEU."
The smoothed target puts 1 - epsilon on the reference token and spreads epsilon
uniformly over the whole vocabulary (the reference included), as
`torch.nn.functional.cross_entropy(label_smoothing=...)` does; pad positions of the
target contribute nothing.

Shape legend: B batch, T target length, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor


@dataclass
class LossOutput:
    """Sums over the real (non-pad) target tokens of a batch.

    Attributes:
        loss: label-smoothed cross-entropy, summed (what training minimises).
        nll: plain negative log-likelihood, summed (for perplexity).
        n_tokens: real target tokens, the denominator of both means (a 0-dim int64
            tensor: reading it as a number would break a `torch.compile` graph).
    """

    loss: Tensor
    nll: Tensor
    n_tokens: Tensor


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, pad_id: int, epsilon: float = 0.1
) -> LossOutput:
    """Summed label-smoothed cross-entropy, pad ignored.

    Computed in float32 whatever the dtype of `logits` (autocast may give bf16).
    `LossOutput.loss / n_tokens` equals `F.cross_entropy(logits, target,
    label_smoothing=epsilon, ignore_index=pad_id)`.

    Args:
        logits: (B, T, V) unnormalised scores.
        target: (B, T) reference ids, padded with `pad_id`.
        pad_id: the id whose positions are ignored.
        epsilon: the smoothing mass.

    Returns:
        The summed loss, the summed NLL and the token count.
    """
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    real = target != pad_id  # (B, T)
    nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    uniform = -log_probs.mean(dim=-1)  # (B, T): cross-entropy against the uniform distribution
    loss = (1.0 - epsilon) * nll + epsilon * uniform
    zero = loss.new_zeros(())
    return LossOutput(
        loss=loss.where(real, zero).sum(),
        nll=nll.where(real, zero).sum(),
        n_tokens=real.sum(),
    )
