"""Where each attention kernel breaks: multi-query associative recall (MQAR) and copying
accuracy against the number of items and the sequence length (issue 46).

    nice -n 19 python -m benchmarks.bench_recall --mode circuit         # set weights (minutes)
    nice -n 19 python -m benchmarks.bench_recall --grid cpu-small       # trained, one cell
    python -m benchmarks.bench_recall --grid gpu --device cuda --jobs 8 # trained, on a lease
    nice -n 19 python -m benchmarks.bench_recall --task distance-copy --mode circuit
    nice -n 19 python -m benchmarks.bench_recall --task selective-copy --grid copy-cpu --jobs 1

`--task` (`TASKS`, `aiayn.data.recall`): `mqar`, or copying N tokens, a cell (L, N)
giving N tokens among L - N positions and then N markers at which to output them in
order: `distance-copy` (the tokens first, then blanks: the answer lies a fixed L - N
positions back) or `selective-copy` (the tokens at random positions: the model must
find them by content, Mamba's section 3.1), both with Mamba's 16 tokens.

MQAR as Zoology draws it (Arora et al. 2023; `aiayn.data.recall`): N key-value pairs,
then each key again at a power-law distance, the model to answer its value there. Every
kernel trains the same small model from the same seeds for the same number of updates,
fixed in `GRIDS` before any run; only `ModelConfig.attention` and its options differ:

    sdpa             full softmax attention
    window-W         sliding window of W positions a side (no global tokens), one window
                     below the pairs' span and one above it
    bigbird          block-sparse: a global block, a sliding block each side, random blocks
    linear           elu + 1 features: a state of Dk x Dv per head whatever the length
    performer-M      FAVOR+ with M random features (no redrawing)

The model: aiayn's decoder-only shape (causal, Zoology's setting) for every causal kernel;
BigBird has no causal form, so a grid that names it runs every kernel on the
encoder-only shape (bidirectional) instead, and the file says which (`shape`). MQAR is
fair to both: no value follows a query, so a bidirectional model cannot read the answer.
Two attention-only layers (Zoology's: no feed-forward sub-layer), pre-norm, rotary
positions, no dropout; AdamW, linear warm-up over a tenth of the updates then linear
decay to zero. A run's score is its accuracy over every query of `EVAL_SEQUENCES`
held-out sequences (drawn from a seed no training batch uses), after its last update.

Results: benchmarks/results/recall-TASK.json, e.g. recall-mqar.json (`--results`): every
run (task, kernel, length, pairs, width, seed, accuracy, final training loss, seconds;
for copying, `pairs` is the N tokens to copy), and per cell the mean and
the spread over seeds; the provenance of `benchmarks.common` (machine, CPU flags, load
average, commit, command). The runs go `--jobs` at a time, one thread each; a results
file is written after every finished cell, so an interrupted sweep keeps what it ran.

Departures from Zoology (who train 64 epochs of 100,000 sequences at V = 8,192 and pick
the best of four learning rates): the CPU grids' vocabulary is their first release's
V = 64 (a power of two above the length from length 128 on, so that N <= V/2 - 1 keys
exist), one learning rate, and budgets of thousands of updates at most; rotary positions
rather than learned ones (in one trial here, 500 updates with rotary positions did as
well as 800 with learned ones).

What a CPU affords: the recall circuit must be learnt before any kernel can be compared,
and that takes thousands of updates. On the shared 2-core machine of issue 46 (load
average near 20), sdpa had reached about half the answers of the easiest cell after
1,500 updates (`--grid probe`, results/recall-mqar-probe.json), so the `cpu` grid (400
updates) does not teach it there; `cpu-small` (one cell, one seed, 4,000 updates) is
what was run, and `gpu` is the comparison the issue asks for.

`--mode circuit` needs no training: the recall step of the circuit with set weights
(`recall_circuit`) goes through each kernel, at the score scale that suits the kernel
best, over Zoology's lengths (results/recall-TASK-circuit.json, in seconds per cell).
It shows what each approximation loses for the softmax circuit's weights; a trained
model of a kernel may find weights of its own. The copying circuits look up a position
(over a distance) or a rank among the data tokens (selective), given exactly as MQAR's
previous token is; for a fixed-state kernel the two are the same task (the blanks'
keys carry no value and change only a positive normaliser), so only the sparse
patterns tell them apart.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.recall_cells import gaps, summarise

log = logging.getLogger("bench_recall")

EVAL_SEQUENCES = 500
EVAL_SEED = 10**6  # held-out sequences: training batches use seeds below it


@dataclass(frozen=True)
class Grid:
    """One sweep, fixed before its runs.

    Attributes:
        cells: (sequence length L, pairs N) to run.
        widths: model widths d_model.
        kernels: the kernel variants (`kernel_settings` names).
        seeds: the seeds of each cell.
        steps: updates per run (the equal budget).
        batch: sequences per update.
        lr: AdamW's peak learning rate.
        heads: attention heads.
        windows: the sliding window's two sizes (positions a side).
        features: Performer's two feature counts.
        block_size: BigBird's block size.
    """

    cells: tuple[tuple[int, int], ...]
    widths: tuple[int, ...]
    kernels: tuple[str, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 400
    batch: int = 64
    lr: float = 3e-3
    heads: int = 2
    windows: tuple[int, int] = (8, 64)
    features: tuple[int, int] = (16, 128)
    block_size: int = 8

    @property
    def shape(self) -> str:
        """decoder_only, or encoder_only where a kernel has no causal form (BigBird)."""
        return "encoder_only" if "bigbird" in self.kernels else "decoder_only"


def kernel_variants(grid: Grid) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each variant's name: (kernel, its options)."""
    small, large = grid.windows
    few, many = grid.features
    return {
        "sdpa": ("sdpa", {}),
        f"window-{small}": ("sliding_window", {"window": small, "global_tokens": 0}),
        f"window-{large}": ("sliding_window", {"window": large, "global_tokens": 0}),
        "bigbird": ("bigbird", {"block_size": grid.block_size, "num_random_blocks": 1}),
        "linear": ("linear", {}),
        f"performer-{few}": ("performer", performer_options(few)),
        f"performer-{many}": ("performer", performer_options(many)),
    }


def performer_options(num_features: int) -> dict[str, Any]:
    """Performer's options here: no redrawing, uniform directions (the results files
    written before `uniform_directions` existed ran the old, unsigned draw: their runs'
    `options` lack it)."""
    return {"num_features": num_features, "redraw_interval": None, "uniform_directions": True}


def default_kernels(windows: tuple[int, int], features: tuple[int, int]) -> tuple[str, ...]:
    return (
        "sdpa",
        f"window-{windows[0]}",
        f"window-{windows[1]}",
        "bigbird",
        "linear",
        f"performer-{features[0]}",
        f"performer-{features[1]}",
    )


GRIDS = {
    # lengths 64 and 128, pairs well inside and at the edge of the state of a width-32
    # linear model, 3 seeds, 400 updates: the budget first planned for 2 cores, too small
    # to teach even sdpa on a loaded machine (the probe); for a quiet one, raise `steps`.
    "cpu": Grid(
        cells=((64, 4), (64, 16), (128, 8), (128, 32)),
        widths=(32,),
        kernels=default_kernels((8, 64), (16, 128)),
    ),
    # can this machine teach sdpa MQAR at all in a CPU budget? One run, the easiest cell
    "probe": Grid(
        cells=((64, 4),), widths=(64,), kernels=("sdpa",), seeds=(0,), steps=1500, batch=32
    ),
    # what the shared machine could afford after the probe: one cell, one seed, four kernels
    "cpu-small": Grid(
        cells=((64, 4),),
        widths=(64,),
        kernels=("sdpa", "linear", "window-8", "performer-16"),
        seeds=(0,),
        steps=4000,
        batch=32,
        windows=(8, 64),
        features=(16, 128),
    ),
    # cpu-small's cell with 3 seeds (issue 46's trained grid, cut to what one thread of
    # the shared machine runs in an afternoon: minutes a run when it is quiet); seeds 1
    # and 2 first, since cpu-small ran seed 0 (Performer then with the old directions)
    "cpu-seeds": Grid(
        cells=((64, 4),),
        widths=(64,),
        kernels=("sdpa", "window-8", "linear", "performer-16"),
        seeds=(1, 2, 0),
        steps=4000,
        batch=32,
    ),
    # copying (--task distance-copy or selective-copy): 8 tokens from a context of 32,
    # farther back than the small window reaches. Fixed before the runs from one
    # calibration of sdpa, seed 0: selective copying at 99.8% after 1,500 updates (45%
    # after 400), copying over a distance at 100% after 400
    "copy-cpu": Grid(
        cells=((40, 8),),
        widths=(32,),
        kernels=("sdpa", "window-8", "linear", "performer-16", "performer-128"),
        steps=1500,
        batch=32,
    ),
    # a quick look at one cell, for trying settings
    "smoke": Grid(cells=((64, 8),), widths=(32,), kernels=("sdpa", "linear"), seeds=(0,), steps=50),
    # the set-weight circuit (`--mode circuit`): no training, so Zoology's lengths fit
    "circuit": Grid(
        cells=((64, 4), (64, 16), (128, 8), (128, 32), (256, 16), (256, 64)),
        widths=(16, 64),
        kernels=default_kernels((8, 64), (16, 128)),
        steps=0,
    ),
    # Zoology's Figure 2 lengths, on a GPU lease
    "gpu": Grid(
        cells=((64, 4), (64, 16), (128, 8), (128, 32), (256, 16), (256, 64), (512, 64)),
        widths=(32, 64, 128),
        kernels=default_kernels((16, 256), (32, 256)),
        steps=3000,
        batch=128,
    ),
}


def vocabulary(length: int) -> int:
    """The MQAR vocabulary V for a length: Zoology's first release's 64 up to length 64,
    else the smallest power of two above the length (room for N <= L/4 keys)."""
    return 64 if length <= 64 else 2 ** math.ceil(math.log2(length + 1))


TASKS = ("mqar", "selective-copy", "distance-copy")
TASK_NAMES = {
    "mqar": "MQAR",
    "selective-copy": "selective copying",
    "distance-copy": "copying over a distance",
}
COPY_VOCAB = 16  # Mamba's selective copying (their section 3.1 and E.1): 16 tokens


@dataclass(frozen=True)
class Task:
    """One cell's task: how its sequences are drawn and which ids can answer.

    Attributes:
        name: one of `TASKS`.
        vocab: V, the ids the sequences use (a model adds one for padding).
        first_answer: the smallest id an answer can be (MQAR's values from V/2, the
            copying tasks' data tokens from 2).
        config: `MQARConfig` or `CopyConfig`.
    """

    name: str
    vocab: int
    first_answer: int
    config: Any

    def draw(self, count: int, seed: int) -> tuple[Any, Any]:
        """(inputs, targets), (count, L) each; the same for the same seed."""
        from aiayn.data.recall import copying, mqar

        if self.name == "mqar":
            return mqar(count, self.config, seed=seed)
        return copying(count, self.config, seed=seed)


def make_task(name: str, length: int, n: int) -> Task:
    """The task of a cell (L, N): MQAR with N pairs in L positions; copying N tokens
    from a context of L - N positions (then N markers: L in all), selective or over a
    distance, with Mamba's 16 tokens.

    Raises:
        ValueError: an unknown task, or a cell out of the task's range (named).
    """
    from aiayn.data.recall import CopyConfig, MQARConfig

    if name == "mqar":
        vocab = vocabulary(length)
        return Task(name, vocab, vocab // 2, MQARConfig(vocab, length, n))
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; the tasks: {', '.join(TASKS)}")
    selective = name == "selective-copy"
    return Task(name, COPY_VOCAB, 2, CopyConfig(COPY_VOCAB, n, length - n, selective))


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """Train one (variant, L, N, width, seed) and score it: the worker's whole job."""
    import torch

    from aiayn import ModelConfig
    from aiayn.data.recall import IGNORE
    from aiayn.models import build_model

    torch.set_num_threads(1)
    grid = Grid(**{**job["grid"], "cells": (), "widths": (), "kernels": ()})
    kernel, options = job["kernel"], job["options"]
    length, pairs, width, seed = job["length"], job["pairs"], job["width"], job["seed"]
    task = make_task(job.get("task", "mqar"), length, pairs)
    vocab = task.vocab
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=vocab + 1,  # the last id pads (never drawn): aiayn's default pad 0 is
        pad_id=vocab,  # MQAR's filler
        bos_id=vocab - 1,
        eos_id=vocab - 2,
        d_model=width,
        n_heads=grid.heads,
        d_ff=0,
        n_layers=2,
        dropout=0.0,
        positional="rotary",
        max_len=length,
        norm_first=True,
        attention=kernel,
        attention_options=options,
        architecture=job["shape"],
    )
    device = torch.device(job.get("device", "cpu"))
    model = build_model(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=grid.lr, betas=(0.9, 0.98))
    warmup = max(1, grid.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min((step + 1) / warmup, (grid.steps - step) / (grid.steps - warmup)),
    )
    started = time.perf_counter()
    model.train()
    for step in range(grid.steps):
        inputs, targets = task.draw(grid.batch, seed=seed * grid.steps + step)
        inputs, targets = inputs.to(device), targets.to(device)
        logits = model(inputs)  # (B, L, V + 1)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    inputs, targets = task.draw(EVAL_SEQUENCES, seed=EVAL_SEED + seed)
    inputs, targets = inputs.to(device), targets.to(device)
    with torch.no_grad():
        guesses = model(inputs).argmax(-1)
    asked = targets != IGNORE
    accuracy = (guesses[asked] == targets[asked]).double().mean().item()
    return {
        "task": task.name,
        "variant": job["variant"],
        "kernel": kernel,
        "options": options,
        "length": length,
        "pairs": pairs,
        "width": width,
        "seed": seed,
        "vocab": vocab,
        "accuracy": round(100 * accuracy, 2),
        "final_loss": round(loss.item(), 4),
        "seconds": round(time.perf_counter() - started, 1),
        "device": str(device),
    }


SCALES = (1.0, 3.0, 10.0, 30.0, 100.0)  # the circuit's score scales; each kernel keeps its best


def recall_circuit(
    kernel: Any,
    inputs: Any,
    vocab: int,
    width: int,
    scale: float,
    seed: int,
    task: str = "mqar",
    n: int = 0,
) -> Any:
    """The recall step of a task's circuit with set weights, through one kernel. Every
    address (a token, a position, a rank) has a random unit code of `width` dimensions;
    a query is scale * the code of the address it looks for, a key the code of the
    address it stands at, a value the code of the token it carries (0 where there is
    none): every vector has `width` dimensions, so a fixed-state kernel keeps a
    width x width state. The answer is read as the token whose code is closest to the
    output. What the earlier layers of a trained model would compute (the previous
    token, a token's rank) is given exactly:

        mqar            query: the token; key: the previous token (the first layer of
                        `tests/unit/data/test_recall.py`'s circuit); value: the token
        distance-copy   query at the i-th marker: position i; key: the position; value:
                        the token (copying over a distance is looking a fixed offset back)
        selective-copy  query at the i-th marker: rank i; key at a data token: its rank
                        among the data tokens (how many came before it); value: the token

    Bidirectional: in MQAR the filler after a query also has the key as its previous
    token, and adds nothing.

    Args:
        kernel: a kernel (`aiayn.nn.kernels.build_kernel`) with one head of `width`.
        inputs: (B, L) sequences of `task`.
        vocab: the task's vocabulary V.
        width: the code size (the head size).
        scale: the queries' scale (the kernel divides by sqrt(width) as well).
        seed: the codes' seed.
        task: one of `TASKS`.
        n: the copying tasks' token count N (the last N positions are the markers).

    Returns:
        (B, L, V) scores; the answer at a query is their argmax.
    """
    import torch

    from aiayn.data.recall import FILLER, MARKER

    generator = torch.Generator().manual_seed(seed)
    length = inputs.size(1)
    codes = torch.randn(max(vocab, length), width, generator=generator)  # MQAR: V >= L
    codes = codes / codes.norm(dim=-1, keepdim=True)  # (addresses, D)
    if task == "mqar":
        contents = codes[:vocab]  # the address is the token
        query, key = inputs, torch.roll(inputs, 1, dims=1)
        key[:, 0] = -1  # position 0 has no previous token
        value = inputs.masked_fill(inputs == FILLER, -1)
    else:
        contents = torch.randn(vocab, width, generator=generator)
        contents = contents / contents.norm(dim=-1, keepdim=True)  # (V, D)
        context = length - n
        positions = torch.arange(length).expand_as(inputs)
        data = (inputs > MARKER) & (positions < context)
        query = torch.where(positions >= context, positions - context, -1)
        if task == "distance-copy":
            key = torch.where(positions < context, positions, -1)
        else:
            key = torch.where(data, data.long().cumsum(1) - 1, -1)  # the rank
        value = torch.where(data, inputs, -1)

    def look_up(table: Any, ids: Any) -> Any:  # -1: the zero vector
        return torch.cat([table, table.new_zeros(1, width)])[ids]  # (B, L, D)

    queries = scale * width**0.5 * look_up(codes, query)  # the kernel divides by sqrt(D)
    keys, values = look_up(codes, key), look_up(contents, value)
    out, _ = kernel(queries[:, None], keys[:, None], values[:, None])  # (B, 1, L, D)
    return out[:, 0] @ contents.T  # (B, L, V): the output read against every token's code


def run_circuit(job: dict[str, Any]) -> dict[str, Any]:
    """One (variant, L, N, width, seed) of the circuit: the best scale's accuracy,
    the scale chosen on a batch of its own (seed + 500), scored on `EVAL_SEQUENCES`."""
    import torch

    from aiayn import ModelConfig
    from aiayn.data.recall import IGNORE
    from aiayn.nn.kernels import build_kernel

    torch.set_num_threads(1)
    length, pairs, width, seed = job["length"], job["pairs"], job["width"], job["seed"]
    task = make_task(job.get("task", "mqar"), length, pairs)
    vocab = max(task.vocab, length)  # the config's size: the kernels see no ids
    torch.manual_seed(seed)  # the kernels' own random draws (Performer, BigBird)
    cfg = ModelConfig(
        vocab_size=vocab, d_model=width, n_heads=1, max_len=length,
        attention=job["kernel"], attention_options=job["options"],
    )  # fmt: skip
    kernel = build_kernel(cfg)
    if isinstance(kernel, torch.nn.Module):
        kernel.eval()

    def accuracy(scale: float, data_seed: int, count: int) -> float:
        inputs, targets = task.draw(count, seed=data_seed)
        with torch.no_grad():
            scores = recall_circuit(
                kernel, inputs, task.vocab, width, scale, seed, task.name, pairs
            )
        first = task.first_answer  # the answer is a value, or a data token
        guesses = scores[..., first:].argmax(-1) + first
        asked = targets != IGNORE
        return (guesses[asked] == targets[asked]).double().mean().item()

    best = max(SCALES, key=lambda scale: accuracy(scale, EVAL_SEED + 500 + seed, 100))
    return {
        "task": task.name,
        "variant": job["variant"],
        "kernel": job["kernel"],
        "options": job["options"],
        "length": length,
        "pairs": pairs,
        "width": width,
        "seed": seed,
        "vocab": task.vocab,
        "scale": best,
        "accuracy": round(100 * accuracy(best, EVAL_SEED + seed, EVAL_SEQUENCES), 2),
    }


def payload(
    mode: str, grid_name: str, grid: Grid, runs: list[dict[str, Any]], jobs: int, task: str = "mqar"
) -> dict:
    """The results file's record of a (possibly partial) sweep of one task."""
    cells = summarise(runs)
    smallest = min(grid.widths)
    sdpa_small = [c for c in cells if c["variant"] == "sdpa" and c["width"] == smallest]
    below = gaps(cells)
    broken = {g["variant"] for g in below if g["breaks"]}
    lengths = sorted({length for length, _ in grid.cells})
    return {
        "measures": [
            {
                "system": f"{variant}: {TASK_NAMES[task]}, "
                + (
                    "the set-weight recall circuit"
                    if mode == "circuit"
                    else "two attention-only layers"
                ),
                "cell": f"lengths {lengths}, widths {list(grid.widths)}, "
                + (f"{grid.steps} updates, " if mode == "train" else "")
                + ("" if grid.seeds == (0, 1, 2) else f"seeds {list(grid.seeds)}, ")
                + common.machine(),
                "harness": f"bench_recall --task {task} --mode {mode} --grid {grid_name}, "
                f"{jobs} runs at a time",
            }
            for variant in grid.kernels
        ],
        "task": task,
        "mode": mode,
        "grid_name": grid_name,
        "grid": asdict(grid),
        "shape": "one bidirectional attention layer, set weights"
        if mode == "circuit"
        else grid.shape,
        "threads": 1,
        "jobs": jobs,
        "eval_sequences": EVAL_SEQUENCES,
        "goals": {
            "sdpa_at_least_99_at_smallest_width": bool(sdpa_small)
            and all(c["mean"] >= 99 for c in sdpa_small),
            "sdpa_smallest_width_means": {
                f"L{c['length']}-N{c['pairs']}": c["mean"] for c in sdpa_small
            },
            "fewest_seeds_per_cell": min((c["seeds"] for c in cells), default=0),
            "fall_20_below_sdpa": {
                family: any(v.startswith(family) for v in broken)
                for family in ("linear", "performer", "window", "bigbird")
            },
        },
        "cells": cells,
        "below_sdpa": below,
        "runs": runs,
    }


def plot(record: dict[str, Any], out: Path) -> Path:
    """Accuracy per cell, one panel per width, one line per kernel variant (the mean over
    seeds, bars from the worst seed to the best), to `out` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = record["cells"]
    widths = sorted({c["width"] for c in cells})
    order = sorted({(c["length"], c["pairs"]) for c in cells})
    variants = list(dict.fromkeys(c["variant"] for c in cells))
    figure, axes = plt.subplots(1, len(widths), figsize=(5.5 * len(widths), 4), squeeze=False)
    for axis, width in zip(axes[0], widths, strict=True):
        for index, variant in enumerate(variants):
            mine = {
                (c["length"], c["pairs"]): c
                for c in cells
                if c["variant"] == variant and c["width"] == width
            }
            xs = [i + (index - len(variants) / 2) * 0.04 for i, k in enumerate(order) if k in mine]
            ys = [mine[k]["mean"] for k in order if k in mine]
            low = [mine[k]["mean"] - mine[k]["min"] for k in order if k in mine]
            high = [mine[k]["max"] - mine[k]["mean"] for k in order if k in mine]
            axis.errorbar(xs, ys, yerr=[low, high], marker="o", ms=4, capsize=2, label=variant)
        axis.set_xticks(range(len(order)), [f"L={length}\nN={n}" for length, n in order])
        axis.set_ylim(-3, 103)
        axis.set_ylabel(f"{TASK_NAMES[record.get('task', 'mqar')]} accuracy (%)")
        axis.set_title(f"width {width}")
        axis.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    what = "set-weight recall circuit" if record.get("mode") == "circuit" else "trained models"
    seeds = len(record["grid"]["seeds"])
    figure.suptitle(f"{TASK_NAMES[record.get('task', 'mqar')]} by kernel ({what}; {seeds} seeds)")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mode",
        choices=("train", "circuit"),
        default="train",
        help="train each kernel's model, or run the set-weight recall circuit through it",
    )
    parser.add_argument(
        "--task",
        choices=TASKS,
        default="mqar",
        help="MQAR, or copying N tokens (a cell's L - N positions, then N markers)",
    )
    parser.add_argument("--grid", choices=sorted(GRIDS), help="default: cpu, or circuit")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--device", default="cpu", help="where --mode train trains (cpu, cuda)")
    parser.add_argument(
        "--results",
        help="results file name (default: recall-TASK, or recall-TASK-circuit)",
    )
    parser.add_argument(
        "--plot",
        nargs="*",
        metavar="PNG",
        help="only draw the results file (to each PNG given, default RESULTS.png); no runs",
    )
    args = parser.parse_args(argv)
    circuit = args.mode == "circuit"
    args.grid = args.grid or ("circuit" if circuit else "cpu")
    args.results = args.results or f"recall-{args.task}" + ("-circuit" if circuit else "")
    if args.plot is not None:
        record = json.loads((common.RESULTS / f"{args.results}.json").read_text())
        for out in args.plot or [common.RESULTS / f"{args.results}.png"]:
            print(f"wrote {plot(record, Path(out))}")
        return
    grid = GRIDS[args.grid]
    variants = kernel_variants(grid)
    unknown = [k for k in grid.kernels if k not in variants]
    if unknown:
        sys.exit(f"aiayn: error: grid {args.grid!r} names unknown kernels {unknown}")
    settings = {k: v for k, v in asdict(grid).items() if k not in ("cells", "widths", "kernels")}
    try:
        for length, pairs in grid.cells:
            make_task(args.task, length, pairs)
    except ValueError as err:
        sys.exit(f"aiayn: error: --task {args.task} --grid {args.grid}: {err}")
    jobs = [
        {
            "task": args.task,
            "grid": settings,
            "variant": variant,
            "kernel": variants[variant][0],
            "options": variants[variant][1],
            "shape": grid.shape,
            "length": length,
            "pairs": pairs,
            "width": width,
            "seed": seed,
            "device": args.device,
        }
        for seed in grid.seeds  # outermost: a sweep cut off has each kernel's first seeds
        for length, pairs in grid.cells
        for width in grid.widths
        for variant in grid.kernels
    ]
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    # CUDA cannot be used in a forked worker: spawn them there
    context = multiprocessing.get_context("spawn" if args.device.startswith("cuda") else None)
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        for done, run in enumerate(pool.map(run_circuit if circuit else run_one, jobs), 1):
            runs.append(run)
            how = f"scale {run['scale']}" if circuit else f"loss {run['final_loss']}"
            print(
                f"[{done}/{len(jobs)}] {run['variant']:>14} L={run['length']} N={run['pairs']} "
                f"d={run['width']} seed={run['seed']}: {run['accuracy']:.1f}% ({how})",
                flush=True,
            )
            record = payload(args.mode, args.grid, grid, runs, args.jobs, args.task)
            record["wall_seconds"] = round(time.perf_counter() - started, 1)
            record["complete"] = done == len(jobs)
            path = common.write_json(args.results, record)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
