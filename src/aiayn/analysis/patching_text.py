"""Activation patching from text: tokenized inputs, the report, its files and its figure.

    inputs = text_inputs(model, tokenizer, "clean text", "corrupted text")
    report = patch_text(model, tokenizer, ...)        # what `aiayn patch` runs
    write_patching(report, "out/")                    # patching.json and the figures

The patching itself, on tensors, is `aiayn.analysis.patching`; this module makes its
inputs from a tokenizer and writes and draws what it measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
from aiayn.analysis.patching import (
    ResidualPoint,
    Stack,
    log_probability,
    logit_difference,
    metric_values,
    normalized,
    patch_heads,
    patch_residual,
)
from aiayn.analysis.viz import AttentionKind, write_png
from aiayn.config import enum_member
from aiayn.data.files import strict_json, write_atomic
from aiayn.data.tokenizer import Tokenizer


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
            return normalized(patched, clean_value, corrupt_value)
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
