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


PROJECTED_ROWS = 256  # rows of logits made at a time: (256, V) floats stay in the cache


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
    whole. The real (non-pad) positions are taken `PROJECTED_ROWS` at a time; each block
    of logits is made, scored and turned into its gradient at once, while it is still in
    the cache, and only the gradients of `hidden`, `weight` and `bias` are kept for the
    backward pass. Pad positions cost nothing. With a vocabulary of thousands and a
    small d_model the logits are most of a training step's memory traffic
    (benchmarks/profile_train.py); fused, the quickstart's step is faster
    (benchmarks/results/train-step-fused-loss.json). The sums equal the unfused loss up to
    float rounding (another order of additions); under autocast the products run in its
    dtype, as `linear` would.

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
    -> (summed smoothed loss, summed nll), float32; the formulas of `_SmoothedCrossEntropy`,
    with x = hidden @ weight.T + bias made block by block and its gradient g taken through
    the product at once: d hidden = g @ weight, d weight = g.T @ hidden, d bias = sum g."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, rows, epsilon, wants_grad):
        ctx.set_materialize_grads(False)
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        with torch.autocast(device, enabled=False):
            states = hidden.reshape(-1, hidden.shape[-1])  # (B*T, D)
            matrix = weight if dtype is None else weight.to(dtype)  # (V, D)
            vocab = matrix.shape[0]
            loss_sum = torch.zeros((), device=hidden.device)
            nll_sum = torch.zeros((), device=hidden.device)
            if wants_grad:
                grad_states = torch.zeros(states.shape, device=hidden.device)  # (B*T, D)
                grad_weight = torch.zeros(weight.shape, device=hidden.device)  # (V, D)
                grad_bias = None if bias is None else torch.zeros(vocab, device=hidden.device)
            for start in range(0, len(rows), PROJECTED_ROWS):
                block = rows[start : start + PROJECTED_ROWS]  # (R,)
                ids = target[start : start + PROJECTED_ROWS].unsqueeze(-1)  # (R, 1)
                x = states[block]
                x = x if dtype is None else x.to(dtype)  # (R, D)
                scores = (x @ matrix.T).float()  # (R, V)
                if bias is not None:
                    scores += bias.float()
                reference = scores.gather(-1, ids).squeeze(-1)  # (R,)
                mean = scores.mean(dim=-1)  # (R,)
                top = scores.amax(dim=-1, keepdim=True)  # (R, 1)
                exp = scores.sub_(top).exp_()  # (R, V), in place: one exp serves both ways
                total = exp.sum(dim=-1)  # (R,)
                lse = top.squeeze(-1) + total.log()  # logsumexp
                nll = lse - reference
                uniform = lse - mean
                loss_sum += ((1.0 - epsilon) * nll + epsilon * uniform).sum()
                nll_sum += nll.sum()
                if not wants_grad:
                    continue
                grad = exp.div_(total.unsqueeze(-1)).sub_(epsilon / vocab)  # softmax - eps/V
                grad.scatter_add_(-1, ids, grad.new_full(ids.shape, epsilon - 1.0))
                if grad_bias is not None:
                    grad_bias += grad.sum(dim=0)
                grad = grad.to(x.dtype)
                grad_states[block] = (grad @ matrix).float()  # (R, D)
                grad_weight += (grad.T @ x).float()  # (V, D)
        if wants_grad:
            ctx.grads = (grad_states.view(hidden.shape), grad_weight, grad_bias)
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
