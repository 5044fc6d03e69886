"""Induction scores of a GPT run as one self-contained HTML page (`aiayn induction --html`).

    scores = score_model(gpt, ids)                       # aiayn.analysis.induction
    write_induction_html(scores, "induction.html", run="runs/gpt", length=50)

The attention explorer draws translations (an encoder, a decoder, cross-attention),
so a GPT run gets this page instead: one layers x heads table per score (prefix
matching, previous token, copying), each cell the score to 3 decimals, coloured as the
PNG heat maps are (viridis; 0 to 1 for the two attention scores, -1 to 1 for copying).
Plain HTML and CSS, nothing fetched: it opens offline.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from matplotlib import colormaps

from aiayn.analysis.induction import InductionScores
from aiayn.files import write_atomic

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
"""


def _cell(value: float | None, low: float, high: float) -> str:
    """One table cell: the score to 3 decimals on its viridis colour; a dash for NaN."""
    if value is None or math.isnan(value):
        return '<td style="background:#e1e5ea">–</td>'
    r, g, b, _ = colormaps["viridis"](min(max((value - low) / (high - low), 0.0), 1.0))
    ink = "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "#fff"
    colour = f"rgb({round(255 * r)},{round(255 * g)},{round(255 * b)})"
    return f'<td style="background:{colour};color:{ink}" data-value="{value!r}">{value:.3f}</td>'


def induction_html(scores: InductionScores, **context: Any) -> str:
    """The page: `context` (run, length...) on top, then one table per score.

    Returns:
        The HTML text: rows are layers, columns heads, both counted from 0.
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
    for name, grid in scores.grids().items():
        heading, low, high = SCORES[name]
        n_heads = grid.size(1)
        parts += [f"<h2>{html.escape(heading)}</h2>", f'<table id="{name}">']
        parts.append("<tr><th></th>" + "".join(f"<th>head {h}</th>" for h in range(n_heads)))
        for layer, row in enumerate(grid.tolist()):
            cells = "".join(_cell(value, low, high) for value in row)
            parts.append(f"<tr><th>layer {layer}</th>{cells}</tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_induction_html(scores: InductionScores, path: str | Path, **context: Any) -> Path:
    """Write `induction_html(scores, **context)` to `path` atomically; return the path."""
    return write_atomic(path, induction_html(scores, **context))
