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

import torch
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
    label_smoothing=epsilon, ignore_index=pad_id)`, and so do the gradients; they
    are written by hand (`_SmoothedCrossEntropy`): one (B, T, V) pass each way
    instead of autograd's chain of log-softmax, gather, mean and masks (measured by
    benchmarks/bench_kernels.py).

    Args:
        logits: (B, T, V) unnormalised scores.
        target: (B, T) reference ids, padded with `pad_id`.
        pad_id: the id whose positions are ignored.
        epsilon: the smoothing mass.

    Returns:
        The summed loss, the summed NLL and the token count.
    """
    real = target != pad_id  # (B, T)
    loss, nll = _SmoothedCrossEntropy.apply(logits, target, real, epsilon)
    return LossOutput(loss=loss, nll=nll, n_tokens=real.sum())


class _SmoothedCrossEntropy(torch.autograd.Function):
    """(logits, target, real, epsilon) -> (summed smoothed loss, summed nll), float32.

    With log p = x - logsumexp(x) over the vocabulary (V entries), per real position:
        nll  = logsumexp(x) - x[target]
        loss = (1 - eps) * nll + eps * (logsumexp(x) - mean(x))
    and so
        d loss / d x = softmax(x) - (1 - eps) * onehot(target) - eps / V
        d nll / d x  = softmax(x) - onehot(target)
    Pad positions get zero gradient. Only the logits and logsumexp are kept for the
    backward pass (the softmax is rebuilt from them there).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, real: Tensor, epsilon: float):
        scores = logits.float()  # (B, T, V)
        lse = torch.logsumexp(scores, dim=-1)  # (B, T)
        nll = lse - scores.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
        uniform = lse - scores.mean(dim=-1)  # cross-entropy against the uniform distribution
        loss = (1.0 - epsilon) * nll + epsilon * uniform
        zero = loss.new_zeros(())
        ctx.save_for_backward(logits, target, real, lse)
        ctx.epsilon = epsilon
        return loss.where(real, zero).sum(), nll.where(real, zero).sum()

    @staticmethod
    def backward(ctx, grad_loss: Tensor | None, grad_nll: Tensor | None):
        logits, target, real, lse = ctx.saved_tensors
        epsilon, vocab = ctx.epsilon, logits.shape[-1]
        grad_loss = torch.zeros((), device=logits.device) if grad_loss is None else grad_loss
        grad_nll = torch.zeros((), device=logits.device) if grad_nll is None else grad_nll
        grad = logits.to(torch.float32, copy=True).sub_(lse.unsqueeze(-1)).exp_()  # softmax
        grad.mul_(grad_loss + grad_nll).sub_(grad_loss * (epsilon / vocab))
        onehot = -(grad_loss * (1.0 - epsilon) + grad_nll)  # at each target id
        grad.scatter_add_(-1, target.unsqueeze(-1), onehot.expand(target.shape).unsqueeze(-1))
        grad.mul_(real.unsqueeze(-1))
        return grad.to(logits.dtype), None, None, None
