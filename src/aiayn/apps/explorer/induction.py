"""Induction scores of a GPT run as one self-contained HTML page (`aiayn induction --html`).

    scores = score_model(gpt, ids)                       # aiayn.analysis.induction
    write_induction_html(scores, "induction.html", run="runs/gpt", length=50)

The attention explorer draws translations (an encoder, a decoder, cross-attention),
so a GPT run gets this page instead: one layers x heads table per score (prefix
matching, previous token, copying), each cell the score to 3 decimals, coloured as the
PNG heat maps are (viridis; 0 to 1 for the two attention scores, -1 to 1 for copying).
Plain HTML and CSS, nothing fetched: it opens offline.

Given the scores of an earlier checkpoint too (`before`, e.g. one from before the phase
change of a run on repeated random symbols), each score gets two tables side by side,
before and after, each cell of the second also showing its change: the heads that
became induction and previous-token heads stand out.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from matplotlib import colormaps

from aiayn.analysis.induction import InductionScores
from aiayn.data.files import write_atomic

# score name -> (heading, colour scale's low and high end)
SCORES = {
    "induction": (
        "Prefix matching (induction): attention from i to i - T + 1 on a repeat",
        0.0,
        1.0,
    ),
    "previous_token": ("Previous token: attention from i to i - 1", 0.0, 1.0),
    "copying": ("Copying: sum(eigenvalues) / sum(|eigenvalues|) of the OV circuit", -1.0, 1.0),
}

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; color: #1d2430; background: #f5f7fa; margin: 1.5rem; }
h1 { font-size: 1.3rem; margin: 0 0 0.3rem; } h2 { font-size: 1rem; margin: 1.4rem 0 0.4rem; }
.context { color: #5c6673; font-family: ui-monospace, monospace; font-size: 0.85rem; }
table { border-collapse: separate; border-spacing: 2px; font-family: ui-monospace, monospace; }
th { font-weight: 400; color: #5c6673; padding: 0.15rem 0.5rem; }
td { min-width: 4rem; padding: 0.35rem 0.5rem; text-align: center; border-radius: 3px; }
.pair { display: flex; gap: 2rem; flex-wrap: wrap; } .pair h3 { font-size: 0.9rem; margin: 0.2rem 0; }
td small { display: block; font-size: 0.7rem; opacity: 0.8; }
"""


def _cell(value: float | None, low: float, high: float, change: float | None = None) -> str:
    """One table cell: the score to 3 decimals on its viridis colour (and its change since
    the earlier scores, when given); a dash for NaN."""
    if value is None or math.isnan(value):
        return '<td style="background:#e1e5ea">–</td>'
    r, g, b, _ = colormaps["viridis"](min(max((value - low) / (high - low), 0.0), 1.0))
    ink = "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "#fff"
    colour = f"rgb({round(255 * r)},{round(255 * g)},{round(255 * b)})"
    shown = f"{value:.3f}"
    if change is not None and not math.isnan(change):
        shown += f"<small>{change:+.3f}</small>"
    return f'<td style="background:{colour};color:{ink}" data-value="{value!r}">{shown}</td>'


def _table(table_id: str, grid: list[list[float]], low: float, high: float,
           earlier: list[list[float]] | None = None) -> list[str]:  # fmt: skip
    """One layers x heads table; with `earlier`, each cell also shows its change."""
    rows = [f'<table id="{table_id}">']
    rows.append("<tr><th></th>" + "".join(f"<th>head {h}</th>" for h in range(len(grid[0]))))
    for layer, row in enumerate(grid):
        cells = "".join(
            _cell(value, low, high, None if earlier is None else value - earlier[layer][head])
            for head, value in enumerate(row)
        )
        rows.append(f"<tr><th>layer {layer}</th>{cells}</tr>")
    rows.append("</table>")
    return rows


def induction_html(
    scores: InductionScores,
    before: InductionScores | None = None,
    before_label: str = "before",
    after_label: str = "after",
    **context: Any,
) -> str:
    """The page: `context` (run, length...) on top, then one table per score.

    Args:
        scores: the grids to show.
        before: the grids of an earlier checkpoint of the same model, shown beside
            each of `scores`' (table ids NAME-before and NAME), or None.
        before_label, after_label: the headings of the two tables when `before` is given.

    Returns:
        The HTML text: rows are layers, columns heads, both counted from 0.

    Raises:
        ValueError: `before` has other grid shapes than `scores`.
    """
    described = " · ".join(f"{key} {value}" for key, value in context.items())
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><title>aiayn · induction heads</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>aiayn induction heads</h1>",
        f'<p class="context">{html.escape(described)}</p>',
        "<p>Rows are layers, columns heads. Colour (viridis, dark to yellow): 0 to 1 for "
        "the two attention scores, -1 to 1 for copying; – where a score is undefined.</p>",
    ]
    earlier = before.grids() if before is not None else None
    for name, grid in scores.grids().items():
        heading, low, high = SCORES[name]
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        if earlier is None:
            parts += _table(name, grid.tolist(), low, high)
            continue
        if earlier[name].shape != grid.shape:
            raise ValueError(
                f"before's {name} grid is {tuple(earlier[name].shape)}, the scores' "
                f"{tuple(grid.shape)}: give scores of the same model"
            )
        old = earlier[name].tolist()
        parts += ['<div class="pair"><div>', f"<h3>{html.escape(before_label)}</h3>"]
        parts += _table(f"{name}-before", old, low, high)
        parts += ["</div><div>", f"<h3>{html.escape(after_label)} (change below)</h3>"]
        parts += _table(name, grid.tolist(), low, high, old)
        parts.append("</div></div>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_induction_html(
    scores: InductionScores,
    path: str | Path,
    before: InductionScores | None = None,
    **context: Any,
) -> Path:
    """Write `induction_html(scores, before, **context)` to `path` atomically; return the
    path."""
    return write_atomic(path, induction_html(scores, before, **context))
