"""Where a quickstart training step's time goes, by op kind, and its share of the matmul peak.

    nice -n 10 python -m benchmarks.profile_train [--corpus /tmp/bible]

Builds the quickstart's training exactly as `aiayn train` does (the recipe
`bible-en-es-cpu`, its model, batches, optimizer and schedule: `aiayn.training.trainer.Trainer`),
makes `--warmup` updates, times `--steps` updates without the profiler (ms per step,
tokens/s, achieved GFLOP/s), then runs `--steps` more under `torch.profiler` on the
CPU and splits their time by op kind:

    matmul / linear     aten mm, addmm, bmm, baddbmm, matmul, linear (forward and backward)
    attention (SDPA)    the fused scaled_dot_product_attention kernels and their backward
    softmax + loss      the loss function's forward (label-smoothed cross-entropy over the
                        vocabulary) and the (log-)softmax and nll backward ops; with the
                        projection fused into the loss (`aiayn.training.loss.network_loss`,
                        since issue 45) this includes the pre-softmax projection's three
                        products, which the fused function makes itself
    layer norm          native_layer_norm and its backward
    embedding           embedding lookups and their backward
    dropout             dropout masks and their backward
    optimizer           everything under torch's `Optimizer.step` / `zero_grad`
    data                building the next batch (`Trainer._next_batch`: ids to padded tensors)
    elementwise         the other aten ops (adds, ReLU, scaling, copies, reductions)
    other / Python      the rest of the step's wall time: autograd bookkeeping, the
                        trainer's Python, the profiler's own cost

Each op's self time counts once, in the first kind above its name or its caller
matches. The shares come from the profiled steps; the ms per step of each kind is its
share of the unprofiled step time. FLOPs per step are `aiayn.training.budget`'s formula on the
batches the timed steps read; the peak is `aiayn.training.budget.measure_matmul_peak` (fp32, and
bf16 where the CPU multiplies it natively) on the same threads. Writes
benchmarks/results/train-profile.json (`--name`); `report.py` renders `train-profile`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import aiayn.training.loss as loss_module
from aiayn.config.recipes import recipes_dir
from aiayn.data.corpus import PreparedCorpus
from aiayn.models import build_model
from aiayn.training.budget import peaks_reached, training_matmul_flops
from aiayn.training.distributed import DistEnv
from aiayn.training.recipe import load_recipe
from aiayn.training.tasks import build_task
from aiayn.training.trainer import Trainer
from benchmarks import common

DATA, LOSS = "aiayn.data", "aiayn.training.loss"  # the ranges this script marks
MATMUL = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "_addmm_activation"}
# (kind, does an event's own name or a caller's name put it there?) in priority order.
KINDS = [
    ("optimizer", lambda name: name.startswith("Optimizer.")),
    ("data", lambda name: name == DATA),
    ("softmax + loss", lambda name: name == LOSS),
    ("matmul / linear", lambda name: name.removeprefix("aten::") in MATMUL),
    ("attention (SDPA)", lambda name: "scaled_dot_product" in name or "flash_attention" in name),
    ("softmax + loss", lambda name: "softmax" in name or "nll_loss" in name),
    ("layer norm", lambda name: "layer_norm" in name),
    ("embedding", lambda name: "embedding" in name),
    ("dropout", lambda name: "dropout" in name or "bernoulli" in name),
]
ORDER = [
    "matmul / linear", "attention (SDPA)", "softmax + loss", "layer norm", "embedding",
    "dropout", "optimizer", "data", "elementwise", "other / Python",
]  # fmt: skip


def kind_of(event: Any) -> str:
    """The op kind of a profiler event: by its own name, then by its callers' names."""
    chain = []
    node = event
    while node is not None:
        chain.append(node.name)
        node = node.cpu_parent
    for kind, matches in KINDS:
        if any(matches(name) for name in chain):
            return kind
    return "elementwise" if event.name.startswith("aten::") else "other / Python"


def marked(function, label: str):
    """`function` inside a profiler range named `label`."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with record_function(label):
            return function(*args, **kwargs)

    return wrapper


def build_trainer(corpus_dir: Path, recipe: Path, overrides: list[str], run_dir: Path):
    """The quickstart's Trainer on the CPU (as `train_from_recipe` builds it), and its model config."""
    loaded = load_recipe(recipe, [f"data.corpus={corpus_dir.resolve()}", *overrides])
    corpus = PreparedCorpus.load(loaded.corpus)
    tokenizer = corpus.tokenizer()
    cfg = loaded.model_config(
        tokenizer.vocab_size, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    )
    task = build_task(loaded.task, cfg)
    data = task.build_data(corpus, tokenizer, loaded.train, DistEnv())
    torch.manual_seed(loaded.train.seed)
    model = build_model(cfg)
    trainer = Trainer(model, task, loaded.train, data.train, run_dir, device="cpu", progress=False)
    return trainer, cfg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path("/tmp/bible"))
    parser.add_argument("--recipe", type=Path, default=recipes_dir() / "bible-en-es-cpu.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--name", default="train-profile")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        sys.exit(f"need --steps >= 1, --warmup >= 0, --threads >= 1; got {vars(args)}")
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as run_dir:
        try:
            trainer, cfg = build_trainer(args.corpus, args.recipe, args.overrides, Path(run_dir))
        except (OSError, ValueError) as err:
            sys.exit(f"profile_train.py: {err}")
        shapes: list[tuple[int, int, int, int]] = []  # (B, S, T, target tokens) read
        next_batch = trainer._next_batch

        def recorded_batch():
            batch = next_batch()
            shapes.append((*batch.src.shape, batch.tgt_in.shape[1], batch.n_tgt_tokens))
            return batch

        trainer._next_batch = marked(recorded_batch, DATA)
        for name in ("label_smoothed_cross_entropy", "projected_cross_entropy"):
            setattr(loss_module, name, marked(getattr(loss_module, name), LOSS))
        network = trainer.model  # no DDP, no compile: the quickstart's eager step

        for _ in range(args.warmup):
            trainer._update(network)
        shapes.clear()
        started = time.perf_counter()
        for _ in range(args.steps):
            trainer._update(network)
        seconds = time.perf_counter() - started
        timed = list(shapes)

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            profiled_start = time.perf_counter()
            for _ in range(args.steps):
                with record_function("aiayn.step"):
                    trainer._update(network)
            profiled_seconds = time.perf_counter() - profiled_start

    totals = dict.fromkeys(ORDER, 0.0)
    steps_us = 0.0
    for event in prof.events():
        if event.name == "aiayn.step":
            steps_us += event.cpu_time_total
            continue
        totals[kind_of(event)] += event.self_cpu_time_total
    # Wall time of the steps not inside any op (the trainer's Python between ops).
    totals["other / Python"] += max(steps_us - sum(totals.values()), 0.0)
    whole = sum(totals.values())
    ms_per_step = 1000 * seconds / args.steps
    kinds = [
        {
            "kind": kind,
            "percent": round(100 * us / whole, 1),
            "ms_per_step": round(ms_per_step * us / whole, 2),
        }
        for kind, us in totals.items()
    ]

    flops = sum(training_matmul_flops(cfg, b, s, t) for b, s, t, _ in timed)
    tgt_tokens = sum(n for *_, n in timed)
    achieved = flops / seconds / 1e9
    peaks = peaks_reached(achieved)
    payload = {
        "measures": [
            {
                "system": "aiayn's quickstart training step by op kind, " + trainer.precision.value,
                "cell": f"the quickstart recipe and corpus, {common.machine()}",
                "harness": f"profile_train, {args.steps} steps after {args.warmup}",
            }
        ],
        "recipe": args.recipe.name,
        "overrides": args.overrides,
        "threads": args.threads,
        "steps": args.steps,
        "warmup": args.warmup,
        "precision": trainer.precision.value,
        "ms_per_step": round(ms_per_step, 2),
        "profiled_ms_per_step": round(1000 * profiled_seconds / args.steps, 2),
        "tgt_tokens_per_step": round(tgt_tokens / args.steps, 1),
        "tgt_tokens_per_s": round(tgt_tokens / seconds, 1),
        "matmul_flops_per_step": round(flops / args.steps),
        "achieved_gflops": round(achieved, 1),
        "peak": peaks,
        "kinds": kinds,
    }
    path = common.write_json(args.name, payload)
    print(
        common.table(
            ["op kind", "ms/step", "%"],
            [[k["kind"], k["ms_per_step"], k["percent"]] for k in kinds],
        )
    )
    print(
        f"{ms_per_step:.1f} ms/step ({payload['profiled_ms_per_step']:.1f} profiled), "
        f"{payload['tgt_tokens_per_s']:,.0f} tgt tok/s, {achieved:.1f} GFLOP/s: "
        + ", ".join(f"{p['percent_reached']}% of {d} peak {p['gflops']}" for d, p in peaks.items())
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
