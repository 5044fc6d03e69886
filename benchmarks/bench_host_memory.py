"""A long training run with and without aiayn's host-memory settings (aiayn.training.host_memory).

    python -m benchmarks.bench_host_memory --corpus runs/quickstart/data --steps 1600 --rounds 2

Each side is `aiayn train` on the quickstart recipe (its validation every 400 updates and
checkpoints every 1.5 minutes included) for `--steps` updates, in a process of its own,
one process at a time, the sides taking turns in the order A B B A ... (`--rounds` of
each). The sides:

- `shipped`: as `aiayn train` runs (oneDNN's kernel cache raised; jemalloc preloaded where
  it is installed, else glibc's malloc keeping freed memory);
- `glibc`: `AIAYN_HOST_MEMORY=glibc`, the cache raised and glibc's malloc keeping freed memory;
- `defaults`: `AIAYN_HOST_MEMORY=default`, PyTorch's and glibc's defaults.

Per process: the training minutes the trainer counts (`metrics.jsonl`), the wall clock of
the whole command, its peak resident memory (`wait4`), the target tokens per second in
each span of 400 updates, the last training and validation losses, and the "host memory"
line of its train.log (what it ran with). Same recipe and
seed on every side, so equal arithmetic gives equal losses. The load average is recorded
before and after. Writes benchmarks/results/<--name>.json (default `host-memory`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiayn.config.recipes import recipes_dir
from aiayn.data.corpus import CORPUS_FILE
from aiayn.training.host_memory import OPT_OUT_ENV
from benchmarks import common

RECIPE = "bible-en-es-cpu.yaml"
SPAN = 400  # updates per span of the rate's trace
SIDE_SETTINGS = {"glibc": "glibc", "defaults": "default"}  # AIAYN_HOST_MEMORY per side


def run_side(side: str, args: argparse.Namespace, run_dir: Path) -> dict:
    """One process of `side`: `aiayn train` for `args.steps` updates; what it measured."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop(OPT_OUT_ENV, None)
    env.pop("LD_PRELOAD", None)
    if side != "shipped":
        env[OPT_OUT_ENV] = SIDE_SETTINGS[side]
    command = [
        sys.executable, "-m", "aiayn", "train", str(recipes_dir() / RECIPE), "--run",
        str(run_dir), "--no-progress", f"data.corpus={args.corpus.resolve()}",
        f"train.max_steps={args.steps}", f"train.max_minutes={args.minutes}",
    ]  # fmt: skip
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = process.stdout.read().decode(errors="replace") if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench_host_memory: the {side} run failed:\n{output[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    log = (run_dir / "train.log").read_text().splitlines()
    train = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    spans: dict[int, list[float]] = {}
    for record in train:
        spans.setdefault((record["step"] - 1) // SPAN, []).append(record["tgt_tokens_per_s"])
    return {
        "train_minutes": round(train[-1]["train_minutes"], 3),
        "wall_seconds": round(wall, 1),
        "peak_rss_gb": round(usage.ru_maxrss / 1e6, 2),  # ru_maxrss is in KiB on Linux
        "tgt_tokens_per_s_by_span": [round(statistics.mean(v)) for _, v in sorted(spans.items())],
        "last_train_loss": train[-1]["loss"],
        "last_valid_loss": valid[-1]["loss"] if valid else None,
        "host_memory": next(
            (line.split("host memory: ", 1)[1] for line in log if "host memory: " in line), None
        ),
    }


def order(sides: list[str], rounds: int) -> list[str]:
    """A B B A A B ...: each side as often first as last, so a drift slows both alike."""
    sequence = []
    for round_ in range(rounds):
        sequence += sides if round_ % 2 == 0 else sides[::-1]
    return sequence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True, help="a prepared Bible corpus")
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--minutes", type=float, default=15, help="the schedule's budget")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pause", type=float, default=20, help="seconds between processes")
    parser.add_argument("--name", default="host-memory")
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        sys.exit(f"need --steps and --rounds >= 1; got {args.steps}, {args.rounds}")
    if not (args.corpus / CORPUS_FILE).exists():
        sys.exit(f"bench_host_memory: no prepared corpus at {args.corpus}")

    sides = ["shipped", "glibc", "defaults"]
    load_before = common.load_average()
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="aiayn-host-memory-") as work:
        for i, side in enumerate(order(sides, args.rounds)):
            time.sleep(args.pause if i else 0)
            run_dir = Path(work) / f"{i}-{side}"
            runs[side].append(run_side(side, args, run_dir))
            shutil.rmtree(run_dir)
            last = runs[side][-1]
            print(
                f"{side}: {last['train_minutes']:.2f} training minutes, "
                f"{last['wall_seconds']:.0f} s in all, {last['peak_rss_gb']} GB peak, "
                f"tok/s by {SPAN} updates {last['tgt_tokens_per_s_by_span']}",
                flush=True,
            )
    load_after = common.load_average()

    def median_minutes(side: str) -> float:
        return statistics.median(r["train_minutes"] for r in runs[side])

    losses = {(r["last_train_loss"], r["last_valid_loss"]) for rs in runs.values() for r in rs}
    payload = {
        "measures": [
            {
                "system": "aiayn train, host memory as shipped and with glibc, against the defaults",
                "cell": f"the quickstart recipe, {args.steps} updates, {common.machine()}",
                "harness": f"bench_host_memory, {args.rounds} rounds, one process at a time",
            }
        ],
        "recipe": RECIPE,
        "threads": os.cpu_count(),  # torch's default in each process: the load it adds
        "steps": args.steps,
        "rounds": args.rounds,
        "order": order(sides, args.rounds),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "sides": {
            side: {"median_train_minutes": median_minutes(side), "runs": rs}
            for side, rs in runs.items()
        },
        "speedup_vs_defaults": {
            side: round(median_minutes("defaults") / median_minutes(side), 3)
            for side in sides
            if side != "defaults"
        },
        "losses_identical": len(losses) == 1,
    }
    path = common.write_json(args.name, payload)
    print(
        f"updates per training minute against the defaults: {payload['speedup_vs_defaults']}; "
        f"losses identical: {payload['losses_identical']}; load {load_before} -> {load_after}; "
        f"wrote {path}"
    )


if __name__ == "__main__":
    main()
