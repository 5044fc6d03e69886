"""Activation patching: which activations carry the difference between two inputs.

    clean = (src_clean, tgt_in)                       # an encoder-decoder's inputs
    corrupt = (src_corrupt, tgt_in)                   # (ids,) for a decoder-only model
    metric = logit_difference(-1, right_id, wrong_id)
    effects = patch_residual(model, clean, corrupt, metric, stack=Stack.ENCODER)  # (L, P)
    heads = patch_heads(model, clean, corrupt, metric, kind=AttentionKind.CROSS)  # (L, H)
    plot_patching(effects - metric_values(model, clean, corrupt, metric)[1], pieces,
                  [f"layer {i}" for i in range(len(effects))], "patching.png")  # patching_text

Shape legend: B batch, L layers, P positions, H heads, T length, D d_model, V vocabulary.

The clean input is run once and its activations kept (`aiayn.nn.hooks.run_with_cache`).
Then, for each cell, the corrupted input is run with one activation taken from the
clean run: the residual stream of one layer at one position (`patch_residual`), or
one head's output before W^O, `hook_z`, at every position (`patch_heads`). Each
cell records `metric(logits)` of that patched run; with `normalize` it is
(patched - corrupt) / (clean - corrupt): 0 where the patch changes nothing, 1 where
it restores the clean metric. Patching by position needs the two inputs aligned
token for token, so they must have the same shapes.

Each cell is its own forward pass of the corrupted input's batch (not several cells
batched together), so that a patch that changes nothing gives the corrupted metric
to the bit. The model runs in eval mode, without gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import Enum

import torch
from torch import Tensor, nn

from aiayn.analysis.viz import AttentionKind
from aiayn.config import enum_member
from aiayn.nn.hooks import HookFunction, hooks, run_with_cache

Metric = Callable[[Tensor], Tensor | float]
"""metric(logits (B, T, V)) -> a scalar."""


class Stack(str, Enum):
    """The stack whose residual stream is patched."""

    ENCODER = "encoder"
    DECODER = "decoder"


class ResidualPoint(str, Enum):
    """Where in each layer the residual stream is patched (`aiayn.nn.layers`)."""

    PRE = "resid_pre"  # entering the layer
    MID = "resid_mid"  # after self-attention
    CROSS = "resid_cross"  # after encoder-decoder attention (an encoder-decoder's decoder)
    POST = "resid_post"  # leaving the layer


# ----- metrics -------------------------------------------------------------------------


def logit_difference(position: int, right_id: int, wrong_id: int) -> Metric:
    """logits[:, position, right_id] - logits[:, position, wrong_id], averaged over the batch.

    Args:
        position: the position whose next-token scores are compared (negative from the end).
        right_id, wrong_id: the two tokens.

    Returns:
        The metric, logits (B, T, V) -> scalar.
    """

    def metric(logits: Tensor) -> Tensor:
        scores = logits[:, position].float()  # (B, V)
        return (scores[:, right_id] - scores[:, wrong_id]).mean()

    return metric


def log_probability(target_ids: Sequence[int] | Tensor, start: int = 0) -> Metric:
    """The summed log-probability of `target_ids` under teacher forcing, averaged over the batch.

    Token i is scored by the distribution at position `start + i`: for a translation
    run, tgt_in = bos + reference and target_ids = reference + eos, start 0; for a
    decoder-only model, ids = prompt + continuation[:-1], target_ids = continuation,
    start = len(prompt) - 1.

    Args:
        target_ids: (N,) the tokens scored, or (B, N), one row per row of the batch.
        start: the position that predicts the first of them.

    Returns:
        The metric, logits (B, T, V) -> scalar (nats, <= 0).

    Raises:
        ValueError (when the metric is called): the tokens run past the logits' length.
    """
    target = torch.as_tensor(target_ids, dtype=torch.long)

    def metric(logits: Tensor) -> Tensor:
        n = target.size(-1)
        if start < 0 or start + n > logits.size(1):
            raise ValueError(
                f"{n} target tokens from position {start} run past the {logits.size(1)} "
                "positions of the logits"
            )
        log_probs = logits[:, start : start + n].float().log_softmax(-1)  # (B, N, V)
        ids = target.to(logits.device).expand(logits.size(0), n)
        return log_probs.gather(-1, ids[..., None]).sum((1, 2)).mean()

    return metric


# ----- patching ------------------------------------------------------------------------


def check_aligned(clean: Sequence[Tensor], corrupt: Sequence[Tensor]) -> None:
    """Refuse inputs that patching by position cannot pair token for token.

    Raises:
        ValueError: a different number of inputs, or an input whose shapes differ,
            naming both lengths.
    """
    if len(clean) != len(corrupt):
        raise ValueError(f"the clean run has {len(clean)} inputs and the corrupted {len(corrupt)}")
    names = ("source", "target") if len(clean) == 2 else ("input",) * len(clean)
    for name, a, b in zip(names, clean, corrupt, strict=True):
        if a.shape != b.shape:
            what = (
                f"{a.size(-1)} and {b.size(-1)} tokens"
                if a.shape[:-1] == b.shape[:-1]
                else f"shapes {tuple(a.shape)} and {tuple(b.shape)}"
            )
            raise ValueError(
                f"the clean and corrupted {name} have {what}: patching by position needs "
                "inputs of the same length, token for token"
            )


@contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) and no gradients inside; the model's mode restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def _run(model: nn.Module, inputs: Sequence[Tensor], patches: dict[str, HookFunction]) -> Tensor:
    with _evaluating(model), hooks(model, patches):
        return model(*inputs)


def _cache(model: nn.Module, inputs: Sequence[Tensor], names: list[str]) -> dict[str, Tensor]:
    with _evaluating(model):
        return run_with_cache(model, *inputs, names=names)[1]


def _value(metric: Metric, logits: Tensor) -> float:
    return float(metric(logits))


def run_patched(
    model: nn.Module,
    clean: Sequence[Tensor],
    corrupt: Sequence[Tensor],
    name: str,
    positions: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
) -> Tensor:
    """The corrupted run's logits with hook point `name` taken from the clean run.

    Args:
        model: any shape; `clean` and `corrupt` are its forward's inputs, aligned.
        name: a hook point (`aiayn.nn.hooks`), e.g. "decoder.layers.0.hook_resid_pre".
        positions: the positions (dim 1 of a residual activation, dim 2 of a per-head
            one) taken from the clean run; None: all.
        heads: for a per-head point (B, H, T, Dv), the heads taken; None: all.

    Returns:
        (B, T, V) logits.

    Raises:
        ValueError: misaligned inputs, or no hook point of that name.
    """
    check_aligned(clean, corrupt)
    cache = _cache(model, clean, [name])
    return _run(model, corrupt, {name: _splice(cache[name], positions, heads)})


def _splice(
    clean_activation: Tensor, positions: Sequence[int] | None, heads: Sequence[int] | None
) -> HookFunction:
    """A hook function putting the clean activation's chosen positions (and heads) in place."""
    shape = clean_activation.shape[:-1]  # (B, T), or (B, H, T) at a per-head point
    take = torch.ones(shape, dtype=torch.bool)
    if positions is not None:
        at = torch.zeros(shape[-1], dtype=torch.bool)
        at[list(positions)] = True
        take &= at
    if heads is not None:
        if len(shape) != 3:
            raise ValueError("heads are chosen at a per-head hook point (hook_z, hook_q...)")
        on = torch.zeros(shape[1], dtype=torch.bool)
        on[list(heads)] = True
        take &= on[:, None]
    take = take[..., None].to(clean_activation.device)  # broadcast over D or Dv

    def patch(activation: Tensor, _name: str) -> Tensor:
        return torch.where(take, clean_activation.to(activation.dtype), activation)

    return patch


def mean_ablation(
    model: nn.Module, reference: Sequence[Tensor], name: str, heads: Sequence[int]
) -> HookFunction:
    """A hook function for per-head point `name` that replaces the given heads' output by
    its mean over the reference batch, position by position: mean ablation.

    Zeroing a head (zero ablation) also takes away its average output, which later
    layers may rely on whatever the input; replacing it by its mean over inputs like
    these takes away only what it does for this input (Wang et al. 2022, "Interpretability
    in the Wild", mean-ablate over a reference distribution). Like `run_patched`, it takes
    an activation from another run: here the reference batch's mean instead of a clean
    run's. The hooked run must be as long as the reference (the mean is per position).

    Args:
        model: any shape; `reference` is its forward's inputs, (B_ref, T) ids for a GPT.
        name: a per-head hook point (B, H, T, Dv), e.g. "decoder.layers.1.self_attn.hook_z".
        heads: the heads replaced.

    Returns:
        The hook function (for `aiayn.nn.hooks.hooks`).

    Raises:
        ValueError: no hook point of that name, or one that is not per head.
    """
    cache = _cache(model, reference, [name])
    if name not in cache:
        raise ValueError(f"no hook point {name!r} in the model")
    mean = cache[name].mean(dim=0, keepdim=True)  # (1, H, T, Dv)
    return _splice(mean, None, heads)


def metric_values(
    model: nn.Module, clean: Sequence[Tensor], corrupt: Sequence[Tensor], metric: Metric
) -> tuple[float, float]:
    """The metric of the clean run and of the corrupted run, unpatched."""
    check_aligned(clean, corrupt)
    return _value(metric, _run(model, clean, {})), _value(metric, _run(model, corrupt, {}))


def normalized(patched: Tensor, clean: float, corrupt: float) -> Tensor:
    """(patched - corrupt) / (clean - corrupt): 0 where a patch changes nothing, 1 where it
    restores the clean metric. Raises ValueError when the two runs agree."""
    if clean == corrupt:
        raise ValueError(
            f"cannot normalise: the clean and corrupted runs give the same metric ({clean:.6g})"
        )
    return (patched - corrupt) / (clean - corrupt)


def _layers(model: nn.Module, stack: Stack) -> nn.ModuleList:
    found = getattr(model, stack.value, None)
    if found is None:
        has = [s.value for s in Stack if getattr(model, s.value, None) is not None]
        raise ValueError(f"the model has no {stack.value}; its stacks: {', '.join(has)}")
    return found.layers


def patch_residual(
    model: nn.Module,
    clean: Sequence[Tensor],
    corrupt: Sequence[Tensor],
    metric: Metric,
    stack: Stack | str = Stack.DECODER,
    point: ResidualPoint | str = ResidualPoint.PRE,
    normalize: bool = False,
) -> Tensor:
    """The metric with the residual stream patched at one layer and position at a time.

    Args:
        model: a `Transformer` (clean, corrupt: (src, tgt_in)), `DecoderOnly` ((ids,))
            or `EncoderOnly` ((ids,)); the inputs aligned (same shapes).
        metric: logits -> scalar (`logit_difference`, `log_probability`).
        stack: "encoder" (positions: source tokens) or "decoder" (target tokens).
        point: where in each layer (`ResidualPoint`).
        normalize: give (patched - corrupt) / (clean - corrupt) instead of the metric.

    Returns:
        (L, P) float32: cell [l, p] is the metric of the corrupted run whose residual
        stream at layer l, position p is the clean run's.

    Raises:
        ValueError: misaligned inputs, a stack the model lacks, resid_cross outside an
            encoder-decoder's decoder, or `normalize` with equal clean and corrupted metrics.
    """
    stack = enum_member(Stack, stack, "stack")
    point = enum_member(ResidualPoint, point, "point")
    check_aligned(clean, corrupt)
    layers = _layers(model, stack)
    if point is ResidualPoint.CROSS and getattr(layers[0], "hook_resid_cross", None) is None:
        raise ValueError("resid_cross exists only in the decoder of an encoder-decoder model")
    names = [f"{stack.value}.layers.{i}.hook_{point.value}" for i in range(len(layers))]
    cache = _cache(model, clean, names)
    n_positions = cache[names[0]].size(1)
    result = torch.empty(len(names), n_positions)
    for layer, name in enumerate(names):
        for position in range(n_positions):
            patch = _splice(cache[name], [position], None)
            result[layer, position] = _value(metric, _run(model, corrupt, {name: patch}))
    if normalize:
        return normalized(result, *metric_values(model, clean, corrupt, metric))
    return result


_HEADS_OF = {
    AttentionKind.ENCODER: ("encoder", "self_attn"),
    AttentionKind.DECODER: ("decoder", "self_attn"),
    AttentionKind.CROSS: ("decoder", "cross_attn"),
}


def patch_heads(
    model: nn.Module,
    clean: Sequence[Tensor],
    corrupt: Sequence[Tensor],
    metric: Metric,
    kind: AttentionKind | str = AttentionKind.DECODER,
    normalize: bool = False,
) -> Tensor:
    """The metric with one head's output (`hook_z`, every position) patched at a time.

    Args:
        model, clean, corrupt, metric, normalize: as `patch_residual`.
        kind: whose heads: encoder self-attention, decoder self-attention, or
            encoder-decoder attention ("cross").

    Returns:
        (L, H) float32: cell [l, h] is the metric of the corrupted run whose head h of
        layer l outputs what it did in the clean run. A layer with fewer heads (a
        pruned model) is NaN past its last.

    Raises:
        ValueError: as `patch_residual`, or a kind of attention the model lacks.
    """
    kind = enum_member(AttentionKind, kind, "kind")
    check_aligned(clean, corrupt)
    stack, sublayer = _HEADS_OF[kind]
    layers = _layers(model, Stack(stack))
    if getattr(layers[0], sublayer, None) is None:
        raise ValueError("the model has no encoder-decoder attention (kind 'cross')")
    names = [f"{stack}.layers.{i}.{sublayer}.hook_z" for i in range(len(layers))]
    cache = _cache(model, clean, names)
    n_heads = [cache[name].size(1) for name in names]
    result = torch.full((len(names), max(n_heads)), math.nan)
    for layer, name in enumerate(names):
        for head in range(n_heads[layer]):
            patch = _splice(cache[name], None, [head])
            result[layer, head] = _value(metric, _run(model, corrupt, {name: patch}))
    if normalize:
        return normalized(result, *metric_values(model, clean, corrupt, metric))
    return result
