"""Resident memory of a frozen inference model, today against an earlier commit.

    python -m benchmarks.bench_memory --before ead7eb6

For each shape, a random-weight Marian model (as `bench_decode.py` makes it) is loaded
and frozen (`aiayn.inference.frozen.freeze`) in a fresh process. The process's resident memory
(VmRSS) is read before loading, after freezing (the literal model and the frozen one:
what `Translator` holds, as it keeps the model for attention maps), and after deleting
the literal model and handing glibc's freed blocks back (`malloc_trim`): what the
frozen model alone holds. Each measurement runs `--repeats` times in
processes of their own and the median is kept. "before" runs the same code from a git
worktree of `--before` (its `src/`), which held some weights two or three times
(a transposed copy beside a packed one, the working copy beside both); it has no int8.
The weights' own size (parameters x 4 bytes, tied embeddings once) is given for
comparison. Writes `benchmarks/results/memory.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import common

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh process with PYTHONPATH set to the checkout's src/.
PROBE = """
import ctypes, gc, json, sys, torch
from pathlib import Path
def rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
torch.set_num_threads(1)
from aiayn.inference.frozen import freeze
from aiayn.io.marian import load_marian_model
start = rss()
model = load_marian_model(sys.argv[1])
weights_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
dtype = {"fp32": None, "int8": torch.int8}[sys.argv[2]]
frozen = freeze(model) if dtype is None else freeze(model, dtype)
with_model = rss() - start
del model
gc.collect()
ctypes.CDLL(None).malloc_trim(0)  # what glibc kept of the freed model goes back
print(json.dumps({"held_mb": rss() - start, "with_model_mb": with_model, "weights_mb": weights_mb}))
"""


def probe(src: Path, directory: Path, dtype: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(directory), dtype],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"probe of {src} {dtype} failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,base")
    parser.add_argument("--before", default="ead7eb6", help="the commit to compare with")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, help="keep the models here (default: temp)")
    args = parser.parse_args()
    workdir = args.workdir or common.default_workdir()
    workdir.mkdir(parents=True, exist_ok=True)
    before = common.baseline_checkout(workdir, args.before) / "src"
    systems = [
        ("before", before, "fp32"),
        ("now", ROOT / "src", "fp32"),
        ("now", ROOT / "src", "int8"),
    ]
    rows, records = [], []
    for size in args.sizes.split(","):
        directory = workdir / f"marian-{size}"
        if not (directory / "config.json").exists():
            common.save_random_marian(size, directory)
        for label, src, dtype in systems:
            probes = [probe(src, directory, dtype) for _ in range(args.repeats)]
            held = common.median([p["held_mb"] for p in probes])
            with_model = common.median([p["with_model_mb"] for p in probes])
            weights = probes[0]["weights_mb"]
            commit = args.before if label == "before" else common.commit()
            records.append(
                dict(
                    size=size,
                    code=label,
                    commit=commit,
                    dtype=dtype,
                    held_mb=held,
                    with_model_mb=with_model,
                    weights_mb=weights,
                )
            )
            rows.append(
                [
                    size,
                    f"{label} ({commit})",
                    dtype,
                    f"{weights:,.0f}",
                    f"{with_model:,.0f}",
                    f"{held:,.0f}",
                ]
            )
    print(
        common.table(
            [
                "shape",
                "code",
                "dtype",
                "fp32 weights MiB",
                "model + frozen MiB",
                "frozen alone MiB",
            ],
            rows,
        )
    )
    path = common.write_json(
        "memory", {"args": {**vars(args), "workdir": str(workdir)}, "results": records}
    )
    print(f"written {path}")


if __name__ == "__main__":
    main()
