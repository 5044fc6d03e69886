"""Activation patching: which activations carry the difference between two inputs.

    clean = (src_clean, tgt_in)                       # an encoder-decoder's inputs
    corrupt = (src_corrupt, tgt_in)                   # (ids,) for a decoder-only model
    metric = logit_difference(-1, right_id, wrong_id)
    effects = patch_residual(model, clean, corrupt, metric, stack=Stack.ENCODER)  # (L, P)
    heads = patch_heads(model, clean, corrupt, metric, kind=AttentionKind.CROSS)  # (L, H)
    plot_patching(effects - metric_values(model, clean, corrupt, metric)[1], pieces,
                  [f"layer {i}" for i in range(len(effects))], "patching.png")

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
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.colors import CenteredNorm
from matplotlib.figure import Figure
from torch import Tensor, nn

from aiayn.analysis.heads import KIND_TITLES
from aiayn.analysis.viz import AttentionKind, write_png
from aiayn.config import enum_member
from aiayn.data.files import strict_json, write_atomic
from aiayn.data.tokenizer import Tokenizer
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


def _normalized(patched: Tensor, clean: float, corrupt: float) -> Tensor:
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
        return _normalized(result, *metric_values(model, clean, corrupt, metric))
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
        return _normalized(result, *metric_values(model, clean, corrupt, metric))
    return result


# ----- from text, and drawing ------------------------------------------------------------


@dataclass(frozen=True)
class TextInputs:
    """A clean and a corrupted text made into a model's inputs, with what labels them.

    Attributes:
        clean, corrupt: the forward's inputs, (src, tgt_in) or (ids,), batch of one.
        source_pieces: an encoder-decoder's source positions (eos last); [] otherwise.
        target_pieces: the decoder's positions: bos + target prefix, or a GPT's ids.
        target_ids: the tokens `log_probability` scores, from position `start`.
        start: see `target_ids`.
    """

    clean: tuple[Tensor, ...]
    corrupt: tuple[Tensor, ...]
    source_pieces: list[str]
    target_pieces: list[str]
    target_ids: list[int]
    start: int


def _pair_label(tokenizer: Tokenizer, a: int, b: int) -> str:
    """A position's label: its piece, or "clean/corrupted" where the two differ."""
    if a == b:
        return tokenizer.id_to_piece(a)
    return f"{tokenizer.id_to_piece(a)}/{tokenizer.id_to_piece(b)}"


def text_inputs(
    model: nn.Module,
    tokenizer: Tokenizer,
    clean: str,
    corrupt: str,
    target: str = "",
) -> TextInputs:
    """Tokenize a clean and a corrupted text for patching.

    An encoder-decoder's source is the text + eos and its decoder reads bos + `target`
    (the same in both runs); `target_ids` is `target` + eos. A decoder-only model
    reads the text + `target`, and `target_ids` is `target`'s tokens, predicted from
    the text's last position on. Either way the last position predicts what follows
    `target` (`logit_difference(-1, ...)`). The tensors go to the model's device.

    Raises:
        ValueError: a model without a decoder, an empty text, texts of different lengths in tokens (naming both),
            or a sequence longer than the model's max_len.
    """
    cfg = model.cfg
    device = next(model.parameters()).device
    if getattr(model, "decoder", None) is None:
        raise ValueError("patching from text needs a translation or a decoder-only (GPT) model")
    encoded = {}
    for option, text in (("--clean", clean), ("--corrupt", corrupt)):
        encoded[option] = tokenizer.encode(text) if text.strip() else []
        if not encoded[option]:
            raise ValueError(f"{option}: the text is empty")
    a, b = encoded["--clean"], encoded["--corrupt"]
    if len(a) != len(b):
        raise ValueError(
            f"--clean has {len(a)} tokens and --corrupt {len(b)}: patching by position "
            "needs texts of the same length in tokens"
        )
    target_ids = tokenizer.encode(target) if target.strip() else []

    def tensor(ids: list[int]) -> Tensor:
        if len(ids) > cfg.max_len:
            raise ValueError(
                f"{len(ids)} tokens are more than the model's max_len={cfg.max_len}: "
                "shorten the texts"
            )
        return torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)

    if getattr(model, "encoder", None) is not None:
        tgt_in = tensor([cfg.bos_id, *target_ids])
        a, b = [*a, cfg.eos_id], [*b, cfg.eos_id]
        return TextInputs(
            clean=(tensor(a), tgt_in),
            corrupt=(tensor(b), tgt_in),
            source_pieces=[_pair_label(tokenizer, x, y) for x, y in zip(a, b, strict=True)],
            target_pieces=[tokenizer.id_to_piece(i) for i in tgt_in[0].tolist()],
            target_ids=[*target_ids, cfg.eos_id],
            start=0,
        )
    # The prompt's last position predicts the target's first token: its index in the
    # prompt, taken before the target is appended.
    start = len(a) - 1
    a, b = a + target_ids, b + target_ids
    return TextInputs(
        clean=(tensor(a),),
        corrupt=(tensor(b),),
        source_pieces=[],
        target_pieces=[_pair_label(tokenizer, x, y) for x, y in zip(a, b, strict=True)],
        target_ids=target_ids,
        start=start,
    )


class MetricKind(str, Enum):
    """What `patch_text` measures (the CLI's --metric)."""

    LOGIT_DIFF = "logit-diff"  # logit of --right minus logit of --wrong, after the target
    LOGPROB = "logprob"  # the summed log-probability of the target (+ eos in translation)


@dataclass(frozen=True)
class PatchingReport:
    """`patch_text`'s result, and what it was measured on.

    Attributes:
        patched: (L, P) the metric of each patched run (`patch_residual`).
        effect: (L, P) what is drawn: patched - corrupt, or normalised.
        positions: a label per position (its piece; "clean/corrupted" where they differ).
        clean_metric, corrupt_metric: the metric of the unpatched runs.
        normalized: whether `effect` is (patched - corrupt) / (clean - corrupt).
        context: texts, metric, stack and point, for patching.json.
        heads: with `patch_text(heads=True)`, per kind of attention ("encoder",
            "decoder", "cross"): the (L, H) patched metrics and their effect.
    """

    patched: Tensor
    effect: Tensor
    positions: list[str]
    clean_metric: float
    corrupt_metric: float
    normalized: bool
    context: dict[str, Any]
    heads: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)

    @property
    def layers(self) -> list[str]:
        """A label per row: "layer 0", "layer 1"..."""
        return [f"layer {i}" for i in range(self.patched.size(0))]

    @property
    def effect_name(self) -> str:
        """What `effect` holds, in words (the heat map's title, patching.json's "effect_is")."""
        if self.normalized:
            return "(patched - corrupt) / (clean - corrupt)"
        return "patched - corrupt"

    def to_json(self, **context: Any) -> str:
        """patching.json's text: `context` (run...) first, then the measurement."""
        record = {
            **context,
            **self.context,
            "clean_metric": self.clean_metric,
            "corrupt_metric": self.corrupt_metric,
            "effect_is": self.effect_name,
            "layers": self.layers,
            "positions": self.positions,
            "effect": self.effect.tolist(),
            "patched": self.patched.tolist(),
        }
        if self.heads:
            record["heads"] = {
                kind: {"effect": grid_to_json(effect), "patched": grid_to_json(patched)}
                for kind, (patched, effect) in self.heads.items()
            }
        return strict_json(record, ensure_ascii=False)


def grid_to_json(grid: Tensor) -> list[list[float | None]]:
    """A (layers, heads) grid as JSON lists, NaN (a pruned model's missing head) as null.

    Args:
        grid: a 2-D tensor.

    Returns:
        Its rows as lists of floats, None where NaN.
    """
    return [[None if math.isnan(v) else v for v in row] for row in grid.tolist()]


def _one_token(tokenizer: Tokenizer, word: str | None, option: str) -> int:
    if word is None or not word.strip():
        raise ValueError(f"--metric logit-diff compares two tokens: give {option}")
    ids = tokenizer.encode(word)
    if len(ids) != 1:
        pieces = " ".join(tokenizer.id_to_piece(i) for i in ids)
        raise ValueError(
            f"{option} {word!r} is {len(ids)} tokens ({pieces}); give a word that is one token"
        )
    return ids[0]


def patch_text(
    model: nn.Module,
    tokenizer: Tokenizer,
    clean: str,
    corrupt: str,
    metric: MetricKind | str = MetricKind.LOGIT_DIFF,
    right: str | None = None,
    wrong: str | None = None,
    target: str = "",
    stack: Stack | str | None = None,
    point: ResidualPoint | str = ResidualPoint.PRE,
    normalize: bool = False,
    heads: bool = False,
) -> PatchingReport:
    """`patch_residual` on two texts (see `text_inputs` for what the model reads).

    Args:
        model: a translation (encoder-decoder) or decoder-only model.
        tokenizer: its tokenizer.
        clean, corrupt: the texts, of the same length in tokens: an encoder-decoder's
            source, or a decoder-only model's prompt.
        metric: logit-diff (`right` minus `wrong`, each one token, at the last
            position) or logprob (of `target`).
        target: the decoder's prefix (translation: the reference scored by logprob),
            or the continuation after the prompt; the same in both runs.
        stack: whose residual stream; default the encoder of a translation model
            (its source differs), the decoder of a decoder-only one.
        point, normalize: as `patch_residual`.
        heads: also `patch_heads` for every kind of attention the model has.

    Raises:
        ValueError: naming the option at fault (--clean, --corrupt, --right, --wrong,
            --target, --metric, --stack, --point).
    """
    metric = enum_member(MetricKind, metric, "--metric")
    inputs = text_inputs(model, tokenizer, clean, corrupt, target)
    if metric is MetricKind.LOGPROB:
        if not inputs.target_ids or not target.strip():
            raise ValueError("--metric logprob scores a target: give --target")
        measure = log_probability(inputs.target_ids, inputs.start)
        about = {"name": metric.value}
    else:
        right_id = _one_token(tokenizer, right, "--right")
        wrong_id = _one_token(tokenizer, wrong, "--wrong")
        measure = logit_difference(-1, right_id, wrong_id)
        about = {"name": metric.value, "right": right, "wrong": wrong}
    translation = bool(inputs.source_pieces)
    default = Stack.ENCODER if translation else Stack.DECODER
    stack = default if stack is None else enum_member(Stack, stack, "--stack")
    point = enum_member(ResidualPoint, point, "--point")
    clean_value, corrupt_value = metric_values(model, inputs.clean, inputs.corrupt, measure)

    def effect_of(patched: Tensor) -> Tensor:
        if normalize:
            return _normalized(patched, clean_value, corrupt_value)
        return patched - corrupt_value

    effect_of(torch.zeros(1))  # refuses --normalize with equal metrics before any patching
    patched = patch_residual(model, inputs.clean, inputs.corrupt, measure, stack, point)
    head_grids = {}
    if heads:
        kinds = list(AttentionKind) if translation else [AttentionKind.DECODER]
        for kind in kinds:
            raw = patch_heads(model, inputs.clean, inputs.corrupt, measure, kind)
            head_grids[kind.value] = (raw, effect_of(raw))
    positions = inputs.source_pieces if stack is Stack.ENCODER else inputs.target_pieces
    context = {
        "clean": clean,
        "corrupt": corrupt,
        "target": target,
        "metric": about,
        "stack": stack.value,
        "point": point.value,
    }
    return PatchingReport(
        patched,
        effect_of(patched),
        positions,
        clean_value,
        corrupt_value,
        normalize,
        context,
        head_grids,
    )


PNG_FILE, JSON_FILE = "patching.png", "patching.json"


def write_patching(report: PatchingReport, out_dir: str | Path, **context: Any) -> list[Path]:
    """Write patching.png (the heat map of `report.effect`) and patching.json into `out_dir`;
    with `report.heads`, also patching-heads-{encoder,decoder,cross}.png, layer x head.

    Args:
        report: from `patch_text`.
        out_dir: the directory (created if missing).
        context: recorded first in patching.json (run=...).

    Returns:
        The paths: PNGs first, the JSON last.
    """
    out_dir = Path(out_dir)
    about = report.context
    name = about["metric"]["name"]
    title = f"{name}: {report.effect_name}\n{about['stack']} {about['point']}, layer x position"
    png = plot_patching(report.effect, report.positions, report.layers, out_dir / PNG_FILE, title)
    paths = [png]
    for kind, (_, effect) in report.heads.items():
        paths.append(
            plot_patching(
                effect,
                [f"head {h}" for h in range(effect.size(1))],
                [f"layer {i}" for i in range(effect.size(0))],
                out_dir / f"patching-heads-{kind}.png",
                f"{name}: {report.effect_name}\n{KIND_TITLES[AttentionKind(kind)]}, layer x head",
            )
        )
    return [*paths, write_atomic(out_dir / JSON_FILE, report.to_json(**context))]


def plot_patching(
    result: Tensor,
    x_labels: Sequence[str],
    y_labels: Sequence[str],
    path: str | Path,
    title: str = "activation patching",
) -> Path:
    """Save a heat map of a patching result as a PNG, atomically.

    The colormap diverges from white at 0 (red above, blue below), symmetric about 0,
    so a patch that changes nothing is white whatever the other cells hold.

    Args:
        result: (rows, columns): layers x positions, or layers x heads.
        x_labels: a label per column (the position's token, or the head).
        y_labels: a label per row (the layer).
        path: the PNG to write.
        title: the figure's title.

    Returns:
        `path`.

    Raises:
        ValueError: labels that do not match the result's shape.
    """
    grid = result.detach().float().cpu().numpy()
    if grid.ndim != 2 or grid.shape != (len(y_labels), len(x_labels)):
        raise ValueError(
            f"{len(y_labels)} x {len(x_labels)} labels for a result of shape {tuple(grid.shape)}"
        )
    rows, columns = grid.shape
    size = (min(2.5 + 0.45 * columns, 16.0), min(1.6 + 0.45 * rows, 12.0))  # inches
    fig = Figure(figsize=size, layout="constrained")
    ax = fig.subplots()
    finite = grid[np.isfinite(grid)]
    half_range = float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0
    image = ax.imshow(grid, cmap="RdBu_r", norm=CenteredNorm(0.0, half_range), aspect="auto")
    ax.set_xticks(range(columns), list(x_labels), rotation=90, fontsize=7)
    ax.set_yticks(range(rows), list(y_labels), fontsize=7)
    fig.colorbar(image, ax=ax, shrink=0.8).ax.tick_params(labelsize=7)
    ax.set_title(title, fontsize=9)
    return write_png(fig, path)
