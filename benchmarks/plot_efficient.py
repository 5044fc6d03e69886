"""The efficient-attention page's plot: each kernel's training pass, time and peak memory
against length, from the committed results of `bench_attention.py --only efficient`.

    python -m benchmarks.plot_efficient [--out benchmarks/results/efficient-attention.png]

Two panels, log-log: milliseconds of one forward + backward pass, and its peak memory
in MiB, at each measured length, one colour per kernel: solid for the CPU
(results/attention.json, record "efficient"), dashed for the GPU where
results/attention-gpu.json holds the same record. A length a kernel skipped (over the
memory cap) has no point.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.bench_efficient import KERNELS

RESULTS = Path(__file__).resolve().parent / "results"
SOURCES = {"CPU": "attention", "GPU": "attention-gpu"}  # label -> results file
PANELS = (("train_ms", "training pass, ms"), ("train_peak_mib", "peak memory, MiB"))


def curves(results: Path = RESULTS) -> dict[tuple[str, str, str], list[tuple[int, float]]]:
    """(device label, kernel, measure) -> [(length, value), ...] over the lengths measured,
    from every source file that exists and holds an "efficient" record."""
    out: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for label, name in SOURCES.items():
        path = results / f"{name}.json"
        if not path.is_file():
            continue
        record = json.loads(path.read_text(encoding="utf-8")).get("efficient")
        for row in record["results"] if record else []:
            for kernel in KERNELS:
                for measure, _ in PANELS:
                    value = row.get(f"{kernel}_{measure}")
                    if value is not None:
                        out.setdefault((label, kernel, measure), []).append((row["length"], value))
    return out


def plot(out: Path, results: Path = RESULTS) -> Path:
    """Draw the two panels into `out` (a PNG) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = curves(results)
    if not lines:
        raise SystemExit(f"no efficient-attention results in {results}")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = dict(zip(KERNELS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for axis, (measure, title) in zip(axes, PANELS, strict=True):
        for (label, kernel, which), points in sorted(lines.items()):
            if which != measure:
                continue
            lengths, values = zip(*sorted(points), strict=True)
            style = "-" if label == "CPU" else "--"
            axis.plot(lengths, values, style, marker="o", color=colours[kernel],
                      label=kernel if label == "CPU" else None)  # fmt: skip
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("length (tokens)")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(KERNELS))
    fig.suptitle(
        "One attention layer, forward + backward (batch 1, d_model 256, 4 heads); "
        "solid: CPU, dashed: GPU"
    )
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "efficient-attention.png")
    args = parser.parse_args()
    print(f"written {plot(args.out)}")


if __name__ == "__main__":
    main()
