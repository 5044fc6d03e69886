"""ListOps accuracy per attention kernel at equal budget (Long Range Arena's comparison).

    python -m benchmarks.bench_efficient --device cuda --data .gpu/listops

Each kernel (sdpa = full attention, sliding_window, bigbird, linear, performer) trains
the same encoder classifier (configs/listops-gpu.yaml; only `model.attention` and that
kernel's options differ) for the same number of updates, once per seed, then scores
the held-out test split with its checkpoint of lowest validation loss. The runs go
--parallel at a time, each in its own process (a worker of this module: the training,
the test score and its peak memory in one process); on one GPU they share the card,
which the results file says.

Per run: test and best validation accuracy, updates, wall seconds, input tokens per
second (texts per second x the training texts' mean length in tokens) and peak memory
(CUDA's allocator, or the process's resident high-water mark on the CPU). Per kernel:
the mean and sample standard deviation over seeds, beside LRA's published ListOps
accuracy (Tay et al. 2021, Table 1). Written to results/efficient-listops.json
(`--results`); every run's log stays in --workdir.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

KERNELS = ("sdpa", "sliding_window", "bigbird", "linear", "performer")
# Each kernel's settings, the same in every run (overrides of the recipe).
KERNEL_SETTINGS = {
    "sdpa": [],
    "sliding_window": ["model.attention_window=128", "model.global_tokens=8"],
    "bigbird": ["model.attention_options={block_size: 64, num_random_blocks: 3}"],
    "linear": [],
    "performer": ["model.attention_options={num_features: 128}"],
}
# LRA's Table 1, ListOps test accuracy; the kernel of ours that is each model's.
LRA_LISTOPS = {
    "sdpa": ("Transformer", 36.37),
    "sliding_window": ("Longformer", 35.63),
    "bigbird": ("BigBird", 36.05),
    "linear": ("Linear Transformer", 16.13),
    "performer": ("Performer", 18.01),
}
RESULT_FILE = "result.json"


def summarise(runs: list[dict]) -> dict[str, dict]:
    """Per kernel: the mean and sample standard deviation (0 for one seed) over its runs
    of test accuracy, best validation accuracy, tokens/s and peak MiB, and the seeds."""
    out = {}
    ran = {r["kernel"] for r in runs}
    for kernel in [k for k in KERNELS if k in ran]:
        mine = [r for r in runs if r["kernel"] == kernel]
        entry = {"seeds": [r["seed"] for r in mine]}
        for key in ("test_accuracy", "best_valid_accuracy", "tokens_per_s", "peak_mib", "steps"):
            values = [r[key] for r in mine if r.get(key) is not None]
            if values:
                entry[key] = statistics.fmean(values)
                entry[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        out[kernel] = entry
    return out


def test_accuracy(run: Path, data: Path, device: str) -> tuple[float, int]:
    """The share of `data`'s test texts whose best-scored class is theirs, by the run's
    checkpoint of lowest validation loss (its last where none), and the texts counted."""
    import torch

    from aiayn.data.classification import read_classes
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.data.lm import padded
    from aiayn.data.tokenizer import SentencePieceTokenizer
    from aiayn.io.checkpoint import BEST_DIR, WEIGHTS_FILE, latest_checkpoint, load_model
    from aiayn.training.tasks.classify import class_ids

    best = run / "checkpoints" / BEST_DIR / WEIGHTS_FILE
    weights = best if best.is_file() else latest_checkpoint(run) / WEIGHTS_FILE
    model = load_model(weights, device).eval()
    corpus = PreparedCorpus.load(data)
    classes = read_classes(corpus)
    index = {name: i for i, name in enumerate(classes)}
    tokenizer = SentencePieceTokenizer.load(run / "spm.model")
    rows = corpus.read("test")
    ids = torch.tensor(class_ids(tokenizer, len(classes)), device=device)
    correct = 0
    with torch.no_grad():
        for start in range(0, len(rows), 16):
            chunk = rows[start : start + 16]
            encoded = [
                e[: model.cfg.max_len] for e in tokenizer.encode_batch([t for t, _ in chunk])
            ]
            inputs = padded(encoded, model.cfg.pad_id)  # as the classify task batches them
            guess = model(inputs.to(device))[:, ids].argmax(-1).cpu()
            correct += sum(
                int(g) == index[label] for g, (_, label) in zip(guess, chunk, strict=True)
            )
    return correct / len(rows), len(rows)


def worker(args: argparse.Namespace) -> None:
    """One run: train, score the test split, write RUN/result.json."""
    import resource

    import torch

    from aiayn.configs import find_recipe
    from aiayn.training.trainer import train_from_recipe

    run = args.workdir / f"{args.kernel}-seed{args.seed}"
    overrides = [
        f"data.corpus={args.data.resolve()}",
        f"model.attention={args.kernel}",
        f"train.seed={args.seed}",
        f"train.max_steps={args.steps}",
        *KERNEL_SETTINGS[args.kernel],
        *args.set,
    ]
    began = time.perf_counter()
    result = train_from_recipe(
        find_recipe(Path(args.recipe)), run, overrides, device=args.device, progress=False
    )
    seconds = time.perf_counter() - began
    accuracy, n_test = test_accuracy(run, args.data, args.device)
    if args.device.startswith("cuda"):
        peak_mib = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open(encoding="utf-8")]
    valid = [r["accuracy"] for r in rows if r.get("kind") == "valid" and "accuracy" in r]
    texts_per_s = [r["tgt_tokens_per_s"] for r in rows if r.get("kind") == "train"]
    record = dict(
        kernel=args.kernel,
        seed=args.seed,
        steps=result.steps,
        stopped=result.stopped,
        seconds=seconds,
        train_minutes=result.train_minutes,
        test_accuracy=100 * accuracy,
        test_texts=n_test,
        best_valid_accuracy=100 * max(valid) if valid else None,
        last_valid_accuracy=100 * valid[-1] if valid else None,
        texts_per_s=statistics.median(texts_per_s) if texts_per_s else None,
        peak_mib=peak_mib,
        overrides=overrides,
    )
    (run / RESULT_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def mean_length(data: Path) -> float:
    """The training texts' mean length in tokens (ListOps: one id per token)."""
    lengths = [len(line.split()) for line in (data / "train.text").open(encoding="utf-8")]
    return statistics.fmean(lengths)


def majority_share(data: Path, split: str) -> float:
    """The percentage of `split`'s texts whose label is its most common one: the
    accuracy of always answering that class."""
    labels = (data / f"{split}.label").read_text(encoding="utf-8").split()
    return 100 * max(labels.count(label) for label in set(labels)) / len(labels)


def launch(args: argparse.Namespace) -> list[dict]:
    """Every (kernel, seed) run as a worker process, --parallel at a time; their records."""
    jobs = [(k, s) for s in args.seeds for k in args.kernels]
    running: list[tuple[str, int, subprocess.Popen, object]] = []
    records = []
    base = [sys.executable, "-m", "benchmarks.bench_efficient", "--worker"]
    shared = ["--device", args.device, "--data", str(args.data), "--workdir", str(args.workdir)]
    shared += ["--steps", str(args.steps), "--recipe", args.recipe]
    shared += [item for value in args.set for item in ("--set", value)]
    while jobs or running:
        while jobs and len(running) < args.parallel:
            kernel, seed = jobs.pop(0)
            log = (args.workdir / f"{kernel}-seed{seed}.log").open("w", encoding="utf-8")
            command = [*base, "--kernel", kernel, "--seeds", str(seed), *shared]
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            running.append((kernel, seed, process, log))
            print(f"started {kernel} seed {seed}", flush=True)
        time.sleep(0.5)
        for item in list(running):
            kernel, seed, process, log = item
            if process.poll() is None:
                continue
            running.remove(item)
            log.close()
            path = args.workdir / f"{kernel}-seed{seed}" / RESULT_FILE
            if process.returncode == 0 and path.is_file():
                records.append(json.loads(path.read_text(encoding="utf-8")))
                r = records[-1]
                print(
                    f"done {kernel} seed {seed}: test {r['test_accuracy']:.1f}%, "
                    f"{r['steps']} updates in {r['seconds']:.0f} s",
                    flush=True,
                )
            else:
                print(f"FAILED {kernel} seed {seed} (exit {process.returncode}): see its log")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--kernels", default=",".join(KERNELS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=1500, help="updates per run (equal budget)")
    parser.add_argument("--data", type=Path, required=True, help="a ListOps data set")
    parser.add_argument("--scale", type=float, default=0.1, help="if --data must be generated")
    parser.add_argument("--recipe", default="listops-gpu")
    parser.add_argument("--set", action="append", default=[], help="one more recipe override")
    parser.add_argument("--parallel", type=int, default=15, help="runs at a time")
    parser.add_argument("--workdir", type=Path, default=Path("runs/bench-efficient"))
    parser.add_argument("--results", default="efficient-listops")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kernel", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    if args.worker:
        args.seed = args.seeds[0]
        return worker(args)
    args.kernels = args.kernels.split(",")
    unknown = sorted(set(args.kernels) - set(KERNELS))
    if unknown:
        parser.error(f"--kernels: unknown {unknown}; choose from {', '.join(KERNELS)}")
    from aiayn.data.listops import ListOpsConfig, write_listops

    write_listops(args.data, ListOpsConfig(scale=args.scale))  # kept if already there
    args.workdir.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    runs = launch(args)
    wall = time.perf_counter() - began
    if not runs:
        sys.exit(f"every run failed: see their logs in {args.workdir}")
    length = mean_length(args.data)
    for r in runs:
        r["tokens_per_s"] = None if r["texts_per_s"] is None else r["texts_per_s"] * length
    summary = summarise(runs)
    manifest = json.loads((args.data / "listops.json").read_text(encoding="utf-8"))
    payload = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "data": manifest,
        "mean_train_tokens": length,
        "majority_accuracy": {s: majority_share(args.data, s) for s in ("valid", "test")},
        "shared_device": f"{args.parallel} runs at a time on one {args.device}",
        "wall_seconds": wall,
        "lra_listops": {k: {"model": m, "accuracy": a} for k, (m, a) in LRA_LISTOPS.items()},
        "kernels": summary,
        "runs": sorted(runs, key=lambda r: (KERNELS.index(r["kernel"]), r["seed"])),
    }
    rows = [
        [
            kernel,
            f"{s['test_accuracy']:.1f} ± {s['test_accuracy_std']:.1f}",
            f"{s['best_valid_accuracy']:.1f}" if "best_valid_accuracy" in s else "—",
            f"{s['tokens_per_s']:,.0f}" if "tokens_per_s" in s else "—",
            f"{s['peak_mib']:,.0f}",
            f"{LRA_LISTOPS[kernel][1]:.1f} ({LRA_LISTOPS[kernel][0]})",
        ]
        for kernel, s in summary.items()
    ]
    headers = ["kernel", "test acc. %", "best valid %", "tokens/s", "peak MiB", "LRA"]
    print(common.table(headers, rows))
    print(f"written {common.write_json(args.results, payload)}")
    if len(runs) < len(args.kernels) * len(args.seeds):
        sys.exit("some runs failed: see their logs in the work directory")


if __name__ == "__main__":
    main()
