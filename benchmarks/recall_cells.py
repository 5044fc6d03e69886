"""A recall sweep's runs as cells: accuracy per cell over seeds, and where a kernel breaks.

Used by `benchmarks/bench_recall.py` (its results files' `cells` and `gaps`).
"""

from __future__ import annotations

import statistics
from typing import Any


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (variant, length, pairs, width): mean, min and max accuracy over the seeds."""
    cells: dict[tuple, list[float]] = {}
    for run in runs:
        key = (run["variant"], run["length"], run["pairs"], run["width"])
        cells.setdefault(key, []).append(run["accuracy"])
    return [
        {
            "variant": variant,
            "length": length,
            "pairs": pairs,
            "width": width,
            "seeds": len(scores),
            "mean": round(statistics.mean(scores), 2),
            "min": min(scores),
            "max": max(scores),
        }
        for (variant, length, pairs, width), scores in cells.items()
    ]


def gaps(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell (length, pairs, width): each variant's mean accuracy less sdpa's, and
    whether it falls 20 points or more below sdpa beyond the seed spread (its best seed
    below sdpa's worst; with one seed, `seeds` 1, the spread is not measured)."""
    sdpa = {(c["length"], c["pairs"], c["width"]): c for c in cells if c["variant"] == "sdpa"}
    out = []
    for cell in cells:
        reference = sdpa.get((cell["length"], cell["pairs"], cell["width"]))
        if reference is None or cell["variant"] == "sdpa":
            continue
        below = round(reference["mean"] - cell["mean"], 2)
        out.append(
            {
                "variant": cell["variant"],
                "length": cell["length"],
                "pairs": cell["pairs"],
                "width": cell["width"],
                "below_sdpa": below,
                "breaks": below >= 20 and cell["max"] < reference["min"],
                "seeds": min(cell["seeds"], reference["seeds"]),  # 1: no spread measured
            }
        )
    return out
