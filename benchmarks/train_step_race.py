"""The quickstart's training step against the same step at another commit.

    python -m benchmarks.train_step_race --against 542294d --corpus runs/quickstart/data

Each side is aiayn's own `Trainer` on the quickstart recipe (`bible-en-es-cpu`, its model,
batches, optimizer and schedule), built in a process of its own from that side's library:
this checkout's `src/`, and a git worktree of `--against` (made once, under `--workdir`).
The two sides take turns, one process at a time (never both at once), `--rounds` times:
each process builds the trainer, makes `--warmup` updates, then times `--steps` updates
(wall clock, after the warm-up). Both sides read the same batches in the same order from
the same seed, so their per-update losses are compared too: equal arithmetic gives equal
losses; a change of summation order gives losses that agree to float rounding at first
and drift apart over the updates.

The table gives each side's median ms per update over the rounds, the median of the
per-round ratios, and the largest relative difference of the losses. Settings (threads,
steps, recipe overrides such as `--set train.precision=fp32`) are fixed on the command
line before the run. The load average is recorded before and after. Writes
benchmarks/results/<--name>.json (default `train-step-vs-<commit>`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from aiayn.config.recipes import recipes_dir
from aiayn.data.corpus import CORPUS_FILE
from benchmarks import common

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "bible-en-es-cpu.yaml"

# The worker: imports only what exists under the same name at both commits (old paths
# still import through aiayn's table of moved modules).
WORKER = r"""
import json, sys, tempfile, time
from pathlib import Path
import torch
from aiayn.data.corpus import PreparedCorpus
from aiayn.models import build_model
from aiayn.training.distributed import DistEnv
from aiayn.training.recipe import load_recipe
from aiayn.training.tasks import build_task
from aiayn.training.trainer import Trainer

corpus_dir, recipe, threads, warmup, steps, overrides = json.loads(sys.argv[1])
torch.set_num_threads(threads)
loaded = load_recipe(Path(recipe), [f"data.corpus={corpus_dir}", *overrides])
corpus = PreparedCorpus.load(loaded.corpus)
tokenizer = corpus.tokenizer()
cfg = loaded.model_config(tokenizer.vocab_size, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
task = build_task(loaded.task, cfg)
data = task.build_data(corpus, tokenizer, loaded.train, DistEnv())
torch.manual_seed(loaded.train.seed)
model = build_model(cfg)
with tempfile.TemporaryDirectory() as run_dir:
    trainer = Trainer(model, task, loaded.train, data.train, Path(run_dir), device="cpu", progress=False)
    losses = []
    for _ in range(warmup):
        losses.append(trainer._update(trainer.model)["loss"])
    started = time.perf_counter()
    for _ in range(steps):
        losses.append(trainer._update(trainer.model)["loss"])
    seconds = time.perf_counter() - started
print("RESULT " + json.dumps({"ms_per_update": 1000 * seconds / steps, "losses": losses,
                              "precision": str(trainer.precision)}))
"""


def run_side(src: Path, settings: list) -> dict:
    """One process of one side: the worker on `src`'s aiayn; its RESULT line, parsed."""
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(settings)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"train_step_race: the worker on {src} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def largest_relative_gap(a: list[float], b: list[float]) -> float:
    """max |a - b| / |a| over the updates both sides made."""
    return max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the commit to race")
    parser.add_argument("--base", default=None, help="race this commit instead of the checkout")
    parser.add_argument("--corpus", type=Path, required=True, help="a prepared Bible corpus")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/aiayn-race"))
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0 or args.threads < 1:
        sys.exit(f"need --rounds, --steps, --threads >= 1 and --warmup >= 0; got {vars(args)}")
    if not (args.corpus / CORPUS_FILE).exists():
        sys.exit(f"train_step_race: no prepared corpus at {args.corpus}")

    args.workdir.mkdir(parents=True, exist_ok=True)
    baseline = common.baseline_checkout(args.workdir, args.against)
    ours = "this checkout" if args.base is None else args.base
    our_src = (
        ROOT / "src"
        if args.base is None
        else common.baseline_checkout(args.workdir, args.base) / "src"
    )
    sides = {ours: our_src, args.against: baseline / "src"}
    recipe = recipes_dir() / RECIPE
    settings = [
        str(args.corpus.resolve()), str(recipe), args.threads, args.warmup, args.steps,
        args.overrides,
    ]  # fmt: skip
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for round_ in range(args.rounds):
        for side, src in sides.items():
            runs[side].append(run_side(src, settings))
            print(f"round {round_ + 1}, {side}: {runs[side][-1]['ms_per_update']:.1f} ms/update")
    load_after = os.getloadavg()

    ours, theirs = (runs[side] for side in sides)
    ratios = [b["ms_per_update"] / a["ms_per_update"] for a, b in zip(ours, theirs, strict=True)]
    gaps = [
        largest_relative_gap(a["losses"], b["losses"]) for a, b in zip(ours, theirs, strict=True)
    ]
    summary = {
        side: {
            "median_ms_per_update": round(statistics.median(r["ms_per_update"] for r in rs), 2),
            "ms_per_update": [round(r["ms_per_update"], 2) for r in rs],
            "precision": rs[0]["precision"],
            "losses": rs[0]["losses"],
        }
        for side, rs in runs.items()
    }
    payload = {
        "measures": [
            {
                "system": f"aiayn's quickstart training step, this checkout against {args.against}",
                "cell": "the quickstart recipe and corpus, this machine's CPU",
                "harness": f"train_step_race, {args.rounds} rounds of {args.steps} updates "
                f"after {args.warmup}, one process at a time",
            }
        ],
        "against": args.against,
        "recipe": RECIPE,
        "overrides": args.overrides,
        "threads": args.threads,
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "sides": summary,
        "speedup_median": round(statistics.median(ratios), 3),
        "speedups": [round(r, 3) for r in ratios],
        "largest_relative_loss_gap": max(gaps),
        "losses_identical": all(g == 0.0 for g in gaps),
    }
    default_name = f"train-step-vs-{args.against}" + ("" if args.base is None else f"-{args.base}")
    path = common.write_json(args.name or default_name, payload)
    names = list(sides)
    print(
        f"{names[0]}: {summary[names[0]]['median_ms_per_update']} ms/update, "
        f"{names[1]}: {summary[names[1]]['median_ms_per_update']} ms/update; "
        f"speed-up {payload['speedup_median']}x (rounds {payload['speedups']}); "
        f"largest relative loss gap {payload['largest_relative_loss_gap']:.2e}; "
        f"load {payload['load_average_before']} -> {payload['load_average_after']}; wrote {path}"
    )


if __name__ == "__main__":
    main()
