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

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from aiayn.models.stacks import PreSoftmaxProjection


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


def network_loss(
    network: nn.Module, inputs: tuple[Tensor, ...], target: Tensor, pad_id: int, epsilon: float
) -> LossOutput:
    """`network(*inputs)`'s logits scored against `target` by label-smoothed cross-entropy.

    A model with a pre-softmax projection (`aiayn.models.stacks.PreSoftmaxProjection`:
    every shape aiayn builds) gives its last states (`project=False`), and the projection
    runs fused with the loss (`projected_cross_entropy`), unless a hook listens to its
    logits; anything else is called as is and scored by `label_smoothed_cross_entropy`.

    Args:
        network: the model, or the trainer's DDP / compiled wrapper of it.
        inputs: the positional arguments of its forward.
        target: (B, T) reference ids, padded with `pad_id`.
        pad_id: the id whose positions are ignored.
        epsilon: the smoothing mass.

    Returns:
        The summed loss, the summed NLL and the token count.
    """
    model = _unwrapped(network)
    fusable = isinstance(model, PreSoftmaxProjection) and _takes_project(model)
    if not fusable or model.hook_logits.listened():
        return label_smoothed_cross_entropy(network(*inputs), target, pad_id, epsilon)
    hidden = network(*inputs, project=False)  # (B, T, D)
    return projected_cross_entropy(
        hidden, model.output_weight(), model.output_bias, target, pad_id, epsilon
    )


def _takes_project(model: nn.Module) -> bool:
    """Whether `model.forward` has the `project` switch (aiayn's shapes do; a subclass
    from elsewhere may not)."""
    return "project" in inspect.signature(model.forward).parameters


def _unwrapped(network: nn.Module) -> nn.Module:
    """The module under DDP's (`module`) and torch.compile's (`_orig_mod`) wrappers."""
    while True:
        inner = getattr(network, "_orig_mod", None) or getattr(network, "module", None)
        if not isinstance(inner, nn.Module):
            return network
        network = inner


PROBABILITY_BYTES = 16 * 2**20  # a chunk's (rows, V) probabilities: at most 16 MiB


def projected_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    pad_id: int,
    epsilon: float = 0.1,
) -> LossOutput:
    """`label_smoothed_cross_entropy(linear(hidden, weight, bias), ...)` without the logits.

    The pre-softmax projection and the loss, fused: the (B, T, V) logits are never made
    whole, and nor is their gradient. The real (non-pad) positions go a chunk at a time
    (`PROBABILITY_BYTES` of probabilities); each chunk's logits are made by one product
    and turned into probabilities by one softmax, in the product's dtype, and those
    probabilities feed the two gradient products at once. The rest of the gradient,
    `-(1 - epsilon)` at each reference token and `-epsilon / V` everywhere, is added in
    float32 without touching the (rows, V) block, and the loss is read from the
    reference token's probability and the mean logit (itself a product with the
    matrix's mean row). Pad positions cost nothing. With a vocabulary of thousands and
    a small d_model the logits are most of a training step's memory traffic
    (benchmarks/profile_train.py); fused, the quickstart's step is faster
    (benchmarks/results/train-step-fused-loss.json). In float32 the sums equal the
    unfused loss up to rounding (another order of additions); under autocast the
    products and the softmax run in its dtype, as `linear` would, and a reference
    probability below float32's smallest normal number counts as that number (a logit
    about 87 below the row's log-sum-exp).

    Only the loss is differentiable: the NLL is for reading (perplexity), and a backward
    pass through it is refused.

    Args:
        hidden: (B, T, D) the decoder's last states.
        weight: (V, D) the pre-softmax matrix (`PreSoftmaxProjection.output_weight`).
        bias: (V,) or None.
        target: (B, T) reference ids, padded with `pad_id`.
        pad_id: the id whose positions are ignored.
        epsilon: the smoothing mass.

    Returns:
        The summed loss, the summed NLL and the token count, as
        `label_smoothed_cross_entropy` gives them.
    """
    real = target != pad_id  # (B, T)
    rows = real.flatten().nonzero().squeeze(-1)  # (M,) the real positions
    wants_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias)
    )
    loss, nll = _ProjectedSmoothedCrossEntropy.apply(
        hidden, weight, bias, target.flatten()[rows], rows, epsilon, wants_grad
    )
    return LossOutput(loss=loss, nll=nll, n_tokens=real.sum())


class _ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """(hidden, weight, bias, target ids of the real rows, the real rows, epsilon, wants_grad)
    -> (summed smoothed loss, summed nll), float32.

    With x = h W^T + b over the V entries of a real row h, p = softmax(x), r its
    reference id and mean(.) over the vocabulary, the formulas of `_SmoothedCrossEntropy`
    read:
        nll  = -log p[r]
        loss = nll + eps * (x[r] - mean(x)),   mean(x) = h . mean(W) + mean(b)
        g = d loss / d x = p - (1 - eps) * onehot(r) - eps / V
    and through the product, d h = g W, d W = g^T h, d b = sum over rows of g. Only the
    p terms need the (rows, V) block; the onehot and constant terms are a row of W per
    row, an `index_add` of h into W's rows, and rank-one sums.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, rows, epsilon, wants_grad):
        ctx.set_materialize_grads(False)
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        with torch.autocast(device, enabled=False):
            matrix = weight if dtype is None else weight.to(dtype)  # (V, D)
            vocab = matrix.shape[0]
            states = hidden.reshape(-1, hidden.shape[-1])[rows]  # (M, D)
            states = states if dtype is None else states.to(dtype)
            exact = states.float()  # (M, D) the product's inputs, in float32
            reference_rows = matrix[target].float()  # (M, D) W[r]
            mean_row = matrix.mean(dim=0, dtype=torch.float32)  # (D,)
            reference = (exact * reference_rows).sum(dim=-1)  # (M,) x[r]
            mean = exact @ mean_row  # (M,) mean(x)
            if bias is not None:
                reference = reference + bias.float()[target]
                mean = mean + bias.float().mean()
            nll_sum = torch.zeros((), device=hidden.device)
            if wants_grad:
                grad_states = torch.empty(exact.shape, device=hidden.device)  # (M, D)
                grad_weight = None  # (V, D), from the first chunk's product on
                grad_bias = None if bias is None else torch.zeros(vocab, device=hidden.device)
            step = _chunk_rows(vocab, matrix.element_size())
            for start in range(0, len(rows), step):
                x = states[start : start + step]  # (R, D)
                scores = x @ matrix.T  # (R, V)
                if bias is not None:
                    scores += bias.to(scores.dtype)
                p = torch.softmax(scores, dim=-1)  # (R, V)
                ids = target[start : start + step].unsqueeze(-1)  # (R, 1)
                chosen = p.gather(-1, ids).float().clamp_min(torch.finfo(torch.float32).tiny)
                nll_sum -= chosen.log().sum()
                if not wants_grad:
                    continue
                grad_states[start : start + step] = p @ matrix  # (R, D)
                product = p.T @ x  # (V, D)
                grad_weight = product.float() if grad_weight is None else grad_weight.add_(product)
                if grad_bias is not None:
                    grad_bias += p.sum(dim=0)
            loss_sum = nll_sum + epsilon * (reference - mean).sum()
        if wants_grad:
            # the onehot and constant terms of g, through the product
            grad_states -= (1.0 - epsilon) * reference_rows + epsilon * mean_row
            if grad_weight is None:  # no real rows
                grad_weight = torch.zeros(weight.shape, device=hidden.device)
            grad_weight.index_add_(0, target, exact, alpha=epsilon - 1.0)
            grad_weight -= (epsilon / vocab) * exact.sum(dim=0)
            if grad_bias is not None:
                grad_bias.index_add_(0, target, grad_bias.new_full(target.shape, epsilon - 1.0))
                grad_bias -= epsilon * len(rows) / vocab
            grad_hidden = hidden.new_zeros(hidden.shape, dtype=torch.float32)  # pads: 0
            grad_hidden.view(-1, hidden.shape[-1])[rows] = grad_states
            ctx.grads = (grad_hidden, grad_weight, grad_bias)
            ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        if grad_nll is not None:
            raise RuntimeError(
                "projected_cross_entropy: only the loss is differentiable, not the NLL"
            )
        if grad_loss is None:
            return (None,) * 7
        grad_states, grad_weight, grad_bias = ctx.grads
        del ctx.grads
        return (
            (grad_states * grad_loss).to(ctx.dtypes[0]),
            (grad_weight * grad_loss).to(ctx.dtypes[1]),
            None if grad_bias is None else (grad_bias * grad_loss).to(ctx.dtypes[2]),
            None, None, None, None,
        )  # fmt: skip


def _chunk_rows(vocab: int, itemsize: int) -> int:
    """Rows per chunk: as many as keep a chunk's (rows, V) probabilities within
    `PROBABILITY_BYTES`. Larger products run faster: the quickstart's 1,728 rows over
    8,000 pieces in bf16, forward and backward, took about 47 ms at 256 rows a chunk and
    43 ms at 1,024 (a microbenchmark of the session that wrote this, not kept; the step
    it belongs to is measured by benchmarks/train_step_race.py)."""
    return max(1, PROBABILITY_BYTES // (vocab * itemsize))
