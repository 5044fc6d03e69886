"""One attention head's numbers, and the files they are kept in.

`aiayn.analysis.heads.head_report` measures every head (see that module for what each
number means); its `HeadReport` is written here as heads.json (every number), report.md
(the extremes of each measure) and a heat map per metric and kind of attention
(`write_head_report`), and heads.json is read back by `read_head_records`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from aiayn.analysis.viz import AttentionKind, write_png
from aiayn.data.files import strict_json, write_atomic

JSON_FILE = "heads.json"
HEADS_FILE = Path("heads") / JSON_FILE  # RUN/heads/heads.json, the default place
REPORT_FILE = "report.md"

# Per-head numbers in heads.json order: field name -> JSON key.
METRICS = {
    "entropy": "entropy",
    "confidence": "confidence",
    "offset_prev": "offset_-1",
    "offset_same": "offset_0",
    "offset_next": "offset_+1",
    "eos": "eos",
    "bos": "bos",
    "punctuation": "punctuation",
    "monotonicity": "monotonicity",
    "ablation": "ablation",
    "gradient": "gradient",
}
UNITS = {
    "entropy": "nats",
    "confidence": "attention weight",
    "offset_-1, offset_0, offset_+1": "share of queries (0 to 1)",
    "eos, bos, punctuation": "attention weight",
    "monotonicity": "Pearson r (-1 to 1)",
    "ablation": "nats/token (mean NLL increase with the head zeroed)",
    "gradient": "nats/token per unit of head mask (sum over pairs of |dL/dm| / tokens)",
    "baseline_nll": "nats/token",
}


@dataclass(frozen=True)
class HeadStats:
    """One head's numbers; None where a metric does not apply to its kind (see module doc)."""

    kind: AttentionKind
    layer: int
    head: int
    entropy: float
    confidence: float
    offset_prev: float | None
    offset_same: float | None
    offset_next: float | None
    eos: float | None
    bos: float | None
    punctuation: float
    monotonicity: float | None
    ablation: float
    gradient: float

    @property
    def name(self) -> str:
        """ "encoder L0 H3": kind, layer and head, counted from 0."""
        return f"{self.kind.value} L{self.layer} H{self.head}"

    def value(self, metric: str) -> float | None:
        """The number under its heads.json key ("offset_-1", "ablation", ...)."""
        return getattr(self, _FIELD_OF[metric])

    def to_dict(self) -> dict[str, Any]:
        """heads.json's record: kind, layer, head, then every metric by its JSON key."""
        return {
            "kind": self.kind.value,
            "layer": self.layer,
            "head": self.head,
            **{key: getattr(self, name) for name, key in METRICS.items()},
        }


_FIELD_OF = {key: name for name, key in METRICS.items()}


@dataclass
class HeadReport:
    """Every head's `HeadStats`, and what they were measured on.

    Attributes:
        heads: in model order (`attention_sublayers`), heads in order within each.
        sentences: pairs measured.
        skipped: pairs left out for being longer than the model's max_len.
        source_tokens: real source tokens (eos included).
        target_tokens: real target tokens (eos included): the NLL's denominator.
        baseline_nll: mean NLL per target token with every head on, in nats.
        config: the model's `ModelConfig.to_dict()`.
    """

    heads: list[HeadStats]
    sentences: int
    skipped: int
    source_tokens: int
    target_tokens: int
    baseline_nll: float
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, **context: Any) -> dict[str, Any]:
        """Plain types for JSON; `context` (run, split...) goes first."""
        return {
            **context,
            "sentences": self.sentences,
            "skipped": self.skipped,
            "source_tokens": self.source_tokens,
            "target_tokens": self.target_tokens,
            "baseline_nll": self.baseline_nll,
            "units": UNITS,
            "config": self.config,
            "heads": [h.to_dict() for h in self.heads],
        }

    def to_json(self, **context: Any) -> str:
        """heads.json's text; see `to_dict`."""
        return strict_json(self.to_dict(**context), ensure_ascii=False)


# ----- writing: heads.json, heat maps, report.md -----------------------------------------


def plot_head_metric(
    values: Sequence[Sequence[float | None]], title: str, digits: int = 2
) -> Figure:
    """A layers x heads heat map of one metric, each cell annotated with its value.

    Args:
        values: per layer, per head; None cells stay blank.
        title: the figure's title.
        digits: decimals of the annotations.

    Returns:
        The matplotlib figure (not shown; call `savefig`).
    """
    n_layers, n_heads = len(values), max(len(row) for row in values)
    grid = np.full((n_layers, n_heads), np.nan)
    for layer, row in enumerate(values):
        grid[layer, : len(row)] = [np.nan if v is None else v for v in row]
    size = (max(3.5, 1.5 + 0.75 * n_heads), 1.4 + 0.55 * n_layers)  # inches
    fig = Figure(figsize=size, layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    low, high = np.nanmin(grid), np.nanmax(grid)
    for (layer, head), v in np.ndenumerate(grid):
        if not np.isnan(v):  # dark text on the light (high) end of viridis
            dark = high > low and (v - low) / (high - low) > 0.6
            colour = "black" if dark else "white"
            ax.text(head, layer, f"{v:.{digits}f}", ha="center", va="center", fontsize=7, c=colour)
    ax.set_xticks(range(n_heads), [str(h) for h in range(n_heads)], fontsize=8)
    ax.set_yticks(range(n_layers), [str(i) for i in range(n_layers)], fontsize=8)
    ax.set_xlabel("head", fontsize=8)
    ax.set_ylabel("layer", fontsize=8)
    fig.colorbar(image, ax=ax, shrink=0.8).ax.tick_params(labelsize=7)
    ax.set_title(title, fontsize=9)
    return fig


KIND_TITLES = {
    AttentionKind.ENCODER: "encoder self-attention",
    AttentionKind.DECODER: "decoder self-attention",
    AttentionKind.CROSS: "encoder-decoder attention",
}
_METRIC_TITLES = {
    "entropy": "entropy (nats)",
    "confidence": "confidence (mean max weight)",
    "offset_-1": "strongest key at offset -1 (share)",
    "offset_0": "strongest key at offset 0 (share)",
    "offset_+1": "strongest key at offset +1 (share)",
    "eos": "weight on eos",
    "bos": "weight on bos",
    "punctuation": "weight on punctuation",
    "monotonicity": "monotonicity (Pearson r)",
    "ablation": "ablation: NLL increase (nats/token)",
    "gradient": "gradient importance (nats/token)",
}


def head_figures(report: HeadReport) -> dict[str, Figure]:
    """A heat map per metric and kind, by file name ("cross-monotonicity.png")."""
    figures = {}
    for kind in AttentionKind:
        of_kind = [h for h in report.heads if h.kind is kind]
        if not of_kind:
            continue
        n_layers = max(h.layer for h in of_kind) + 1
        for metric in METRICS.values():
            rows: list[list[float | None]] = [[] for _ in range(n_layers)]
            for h in of_kind:
                rows[h.layer].append(h.value(metric))
            if all(v is None for row in rows for v in row):
                continue  # the metric does not apply to this kind
            digits = 3 if metric in ("ablation", "gradient") else 2
            title = f"{KIND_TITLES[kind]}\n{_METRIC_TITLES[metric]}"
            figures[f"{kind.value}-{metric}.png"] = plot_head_metric(rows, title, digits)
    return figures


def _table(heads: Sequence[HeadStats], columns: Sequence[str]) -> list[str]:
    lines = ["| head | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for h in heads:
        cells = ["–" if h.value(c) is None else f"{h.value(c):.4g}" for c in columns]
        lines.append(f"| {h.name} | " + " | ".join(cells) + " |")
    return lines


def _top(heads: Sequence[HeadStats], metric: str, n: int, largest: bool) -> list[HeadStats]:
    scored = [h for h in heads if h.value(metric) is not None]
    return sorted(scored, key=lambda h: h.value(metric), reverse=largest)[:n]


def report_markdown(report: HeadReport, title: str, split: str | None = None, n: int = 5) -> str:
    """The short markdown summary: the extremes of each measure, `n` heads each."""
    where = f" of the {split} split" if split else ""
    lines = [
        f"# Attention heads: {title}",
        "",
        f"{report.sentences} sentence pairs{where} under teacher forcing "
        f"({report.source_tokens} source and {report.target_tokens} target tokens"
        + (f"; {report.skipped} longer than max_len skipped" if report.skipped else "")
        + f"). Baseline NLL {report.baseline_nll:.4f} nats/token. Heads are named kind, "
        "layer, head, counted from 0; every number is in heads.json, heat maps per metric "
        "and kind beside it.",
    ]
    sections = [
        ("Most confident (mean largest weight, Voita et al. 2019)", "confidence", True,
         ["confidence", "entropy"], None),
        ("Least important by ablation (NLL increase with the head zeroed, nats/token)",
         "ablation", False, ["ablation", "gradient"], None),
        ("Least important by gradient (Michel et al. 2019, nats/token per unit mask)",
         "gradient", False, ["gradient", "ablation"], None),
        ("Most positional: previous token (share of queries, offset -1)", "offset_-1", True,
         ["offset_-1", "offset_0"], None),
        ("Most positional: next token (share of queries, offset +1)", "offset_+1", True,
         ["offset_+1", "offset_0"], None),
        ("Most monotone encoder-decoder attention (Pearson r, target vs. strongest source "
         "position)", "monotonicity", True, ["monotonicity", "confidence"], AttentionKind.CROSS),
    ]  # fmt: skip
    for heading, metric, largest, columns, kind in sections:
        heads = [h for h in report.heads if kind is None or h.kind is kind]
        top = _top(heads, metric, n, largest)
        if top:
            lines += ["", f"## {heading}", "", *_table(top, columns)]
    return "\n".join(lines) + "\n"


def write_head_report(
    report: HeadReport, out_dir: str | Path, run: str | None = None, split: str | None = None
) -> list[Path]:
    """Write heads.json, report.md and the heat maps into `out_dir`, each atomically.

    Args:
        report: from `head_report`.
        out_dir: the directory (created if missing).
        run, split: what was measured, recorded in heads.json and report.md.

    Returns:
        The paths written: heads.json, report.md, then the PNGs.
    """
    out_dir = Path(out_dir)
    figures = head_figures(report)  # all drawn before anything is written
    context = {key: value for key, value in (("run", run), ("split", split)) if value is not None}
    paths = [
        write_atomic(out_dir / JSON_FILE, report.to_json(**context)),
        write_atomic(out_dir / REPORT_FILE, report_markdown(report, run or "model", split)),
    ]
    paths += [write_png(fig, out_dir / name) for name, fig in figures.items()]
    return paths


# ----- reading heads.json back -----------------------------------------------------------

HeadKey = tuple[AttentionKind, int, int]  # kind, layer, head


def read_head_records(path: str | Path) -> dict[HeadKey, dict[str, Any]]:
    """The per-head records of a heads.json written by `write_head_report`.

    Args:
        path: the heads.json.

    Returns:
        (kind, layer, head) -> that head's metrics by their JSON keys (kind, layer and
        head left out); a metric the file lacks is absent, one that does not apply is None.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, no "heads" list, or a record without a valid kind
            (encoder, decoder, cross), layer and head, or listed twice; named by
            file and record number.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not readable JSON ({err}); rerun `aiayn heads`") from None
    records = data.get("heads") if isinstance(data, dict) else None
    if not isinstance(records, list):
        raise ValueError(f'{path} has no "heads" list; rerun `aiayn heads`')
    kinds = {kind.value: kind for kind in AttentionKind}
    heads: dict[HeadKey, dict[str, Any]] = {}
    for number, record in enumerate(records, start=1):
        try:
            key = (kinds[record["kind"]], int(record["layer"]), int(record["head"]))
            if key[1] < 0 or key[2] < 0 or isinstance(record["layer"], bool):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{path}: record {number} needs a kind ({', '.join(kinds)}), a layer and a "
                "head, each counted from 0"
            ) from None
        if key in heads:
            raise ValueError(
                f"{path}: record {number} repeats {key[0].value} layer {key[1]} head {key[2]}"
            )
        heads[key] = {k: v for k, v in record.items() if k not in ("kind", "layer", "head")}
    return heads
