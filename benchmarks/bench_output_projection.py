"""The output projection's two float32 layouts at decoding's row counts: oneDNN's packed
weight against MKL's product on W^T, and what `FrozenLinear` picks.

    python -m benchmarks.bench_output_projection [--threads 1] [--rounds 7]

For each projection (d_model x vocabulary: the benchmark models' 8,000 pieces, a
32,000-piece vocabulary, and opus-mt en-de's 58,101 at d_model 512) and rows R = 1, 2, 4
(a greedy or beam decoding step of one sentence), three products of the same weight take
turns, call by call, in an order that turns round by round:

- onednn: `torch.ops.mkldnn._linear_pointwise` on the packed weight (what a large
  `FrozenLinear` runs);
- W^T: `torch.addmm` on the contiguous (in, out) copy, which the output projection
  keeps beside the packed weight for the output shortlist;
- FrozenLinear: `freeze`'s output projection (`FrozenLinear(..., keep_transposed=True)`),
  which takes W^T for one row and oneDNN otherwise.

Reported: microseconds per product (median over rounds) and W^T's and FrozenLinear's
speed relative to oneDNN (> 1: faster). Writes benchmarks/results/output-projection.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from aiayn.inference.frozen import FrozenLinear
from benchmarks import common

SHAPES = {  # name -> (vocabulary, d_model)
    "8,000 x 256": (8000, 256),
    "8,000 x 512": (8000, 512),
    "32,000 x 512": (32000, 512),
    "58,101 x 512 (opus-mt en-de)": (58101, 512),
}
ROWS = (1, 2, 4)


def products(vocab: int, d_model: int) -> dict:
    """The three products of one random weight, each a function of x."""
    weight, bias = torch.randn(vocab, d_model) / d_model**0.5, torch.randn(vocab)
    frozen = FrozenLinear(weight, bias, keep_transposed=True)
    if frozen.packed is None:
        raise RuntimeError("oneDNN is not available to this PyTorch: nothing to compare")

    def onednn(x):
        return torch.ops.mkldnn._linear_pointwise(x, frozen.packed, bias, "none", [], "")

    def transposed(x):
        return torch.addmm(bias, x, frozen.weight_t)

    return {"onednn": onednn, "W^T": transposed, "FrozenLinear": frozen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=50, help="products per timed call")
    parser.add_argument("--results", default="output-projection")
    args = parser.parse_args()
    common.set_threads(args.threads)
    cells = []
    with torch.inference_mode():
        for name, (vocab, d_model) in SHAPES.items():
            candidates = products(vocab, d_model)
            for rows in ROWS:
                x = torch.randn(rows, d_model)
                times: dict[str, list[float]] = {c: [] for c in candidates}
                labels = list(candidates)
                for round_ in range(args.rounds + 1):  # the first round warms up
                    # the order turns round by round: a product runs right after each of
                    # the others as often, whichever layout the cache holds then
                    for label in labels[round_ % 3 :] + labels[: round_ % 3]:
                        run = candidates[label]
                        began = time.perf_counter()
                        for _ in range(args.repeats):
                            run(x)
                        times[label].append((time.perf_counter() - began) / args.repeats)
                us = {c: 1e6 * statistics.median(t[1:]) for c, t in times.items()}
                cells.append(
                    {
                        "shape": name,
                        "rows": rows,
                        "us": us,
                        "speedup_vs_onednn": {c: us["onednn"] / v for c, v in us.items()},
                    }
                )
    headers = ["projection", "rows", *(f"{c} us" for c in us), "W^T / oneDNN", "Frozen / oneDNN"]
    print(
        common.table(
            headers,
            [
                [
                    c["shape"],
                    c["rows"],
                    *(f"{v:,.1f}" for v in c["us"].values()),
                    f"{c['speedup_vs_onednn']['W^T']:.2f}x",
                    f"{c['speedup_vs_onednn']['FrozenLinear']:.2f}x",
                ]
                for c in cells
            ],
        )
    )
    payload = {"args": vars(args), "cells": cells}
    print(f"written {common.write_json(args.results, payload)}")


if __name__ == "__main__":
    main()
