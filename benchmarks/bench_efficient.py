"""Each attention kernel at equal budget on Long Range Arena's kinds of task, built offline:
ListOps, byte-level text classification (the Bible's genres) and a character-level
language model at context 2,048 on a GPU, or 256 on the CPU at one thread a run.

    python -m benchmarks.bench_efficient --task listops --device cuda --data .gpu/listops
    python -m benchmarks.bench_efficient --task bible-genre --device cuda --data .gpu/bible-genre
    python -m benchmarks.bench_efficient --task charlm --device cuda --data .gpu/bible-chars
    OMP_NUM_THREADS=1 python -m benchmarks.bench_efficient --task charlm-cpu --device cpu \
        --data data/bible-chars --steps 1200 --parallel 2

Each kernel (sdpa = full attention, sliding_window, bigbird, linear, performer; the
language model takes the causal ones, so no bigbird) trains the task's recipe (`TASKS`;
only `model.attention` and that kernel's options differ) for the same number of
updates or minutes, once per seed, then scores the held-out test split with its
checkpoint of lowest validation loss: accuracy for the classification tasks, bits per
character for the language model. The runs go --parallel at a time, each in its own
process (a worker of this module: the training, the test score and its peak memory in
one process); on one GPU they share the card, which the results file says.

Per run: the test score and the best validation score, updates, wall seconds, input
tokens per second (for classification: texts per second x the training texts' mean
length in tokens) and peak memory (CUDA's allocator, or the process's resident
high-water mark on the CPU). Per kernel: the mean and sample standard deviation over
seeds. Beside them, baselines: the most common class (and for ListOps, the class most
common after the root operator, the first token; for the genres, a naive Bayes
classifier of character 4-grams, which reads the whole text without attention), or a
unigram model of the characters; and LRA's published ListOps accuracy (Tay et al.
2021, Table 1). A language model's test bits per character are also kept by position
in the block, in buckets that double in reach (`position_edges`): whether a kernel
still gains from far context; `--plot PNG` draws them from the results file. Written to
results/efficient-TASK.json (`--results`); every run's log and result stay in
--workdir, and `--reuse` reads the runs already there instead of training them again.
A data set missing from --data is written first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks import common

KERNELS = ("sdpa", "sliding_window", "bigbird", "linear", "performer")
CAUSAL_KERNELS = ("sdpa", "sliding_window", "linear", "performer")  # BigBird has no causal form
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


@dataclass(frozen=True)
class Task:
    """One comparison: its recipe, the kernels that can run it, and how it is scored.

    Attributes:
        recipe: the packaged recipe every run trains.
        kernels: the kernels compared (the language model's must be causal).
        metric: "accuracy" (classification, %) or "bpc" (language model, bits per
            character; lower is better).
        settings: kernels whose settings differ from `KERNEL_SETTINGS` here.
    """

    recipe: str
    kernels: tuple[str, ...]
    metric: str
    settings: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def kernel_settings(self, kernel: str) -> list[str]:
        """The recipe overrides that set up `kernel` for this task."""
        return list(dict(self.settings).get(kernel, KERNEL_SETTINGS[kernel]))


# The CPU char-LM's window, 32 characters with no global tokens, is an eighth of its
# context of 256: a kernel that reads further than 32 back shows it in the loss by position.
CPU_WINDOW = ("model.attention_options={window: 32, global_tokens: 0}",)
TASKS = {
    "listops": Task("listops-gpu", KERNELS, "accuracy"),
    "bible-genre": Task("bible-genre-gpu", KERNELS, "accuracy"),
    "charlm": Task("charlm-gpu", CAUSAL_KERNELS, "bpc"),
    "charlm-cpu": Task("charlm-cpu", CAUSAL_KERNELS, "bpc", (("sliding_window", CPU_WINDOW),)),
}
SCORES = ("test_accuracy", "best_valid_accuracy", "test_bpc", "best_valid_bpc")


def write_data(task: str, data: Path, scale: float) -> None:
    """Write `task`'s data set into `data` unless it is there (ListOps' generator keeps
    a data set of the same settings; the Bible's need the SWORD packages)."""
    if task == "listops":
        from aiayn.data.listops import ListOpsConfig, write_listops

        write_listops(data, ListOpsConfig(scale=scale))
    elif (data / "corpus.json").is_file():
        return
    elif task == "bible-genre":
        from aiayn.data.bible_books import Labels, PassageConfig, write_bible_books

        write_bible_books(data, PassageConfig(labels=Labels.GENRE))
    else:
        from aiayn.data.lm import prepare_lm_bible
        from aiayn.data.prepare import PrepareConfig

        prepare_lm_bible(data, "en", config=PrepareConfig(vocab_size=256, model_type="char"))


def summarise(runs: list[dict]) -> dict[str, dict]:
    """Per kernel: the mean and sample standard deviation (0 for one seed) over its runs
    of each score it has (test and best validation accuracy, or bits per character),
    tokens/s, peak MiB and updates, the seeds, and the mean over seeds of each bucket of
    the test bits per character by position, where the runs have it."""
    out = {}
    ran = {r["kernel"] for r in runs}
    for kernel in [k for k in KERNELS if k in ran]:
        mine = [r for r in runs if r["kernel"] == kernel]
        entry = {"seeds": [r["seed"] for r in mine]}
        for key in (*SCORES, "tokens_per_s", "peak_mib", "steps"):
            values = [r[key] for r in mine if r.get(key) is not None]
            if values:
                entry[key] = statistics.fmean(values)
                entry[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        curves = [r["test_bpc_by_position"] for r in mine if "test_bpc_by_position" in r]
        if curves:  # the same edges in every run of a task
            per_bucket = zip(*(c["bpc"] for c in curves), strict=True)
            entry["test_bpc_by_position"] = {
                "edges": curves[0]["edges"],
                "bpc": [statistics.fmean(values) for values in per_bucket],
            }
        out[kernel] = entry
    return out


def best_model(run: Path, device: str):
    """The run's model at its checkpoint of lowest validation loss (its last where none)."""
    from aiayn.io.checkpoint import BEST_DIR, WEIGHTS_FILE, latest_checkpoint, load_model

    best = run / "checkpoints" / BEST_DIR / WEIGHTS_FILE
    weights = best if best.is_file() else latest_checkpoint(run) / WEIGHTS_FILE
    return load_model(weights, device).eval()


def test_accuracy(run: Path, data: Path, device: str) -> tuple[float, int]:
    """The share of `data`'s test texts whose best-scored class is theirs, by the run's
    best model (`best_model`), and the texts counted."""
    import torch

    from aiayn.data.classification import read_classes
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.data.lm import padded
    from aiayn.data.tokenizer import SentencePieceTokenizer
    from aiayn.training.tasks.classify import class_ids

    model = best_model(run, device)
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


def pieces_per_character(data: Path, split: str) -> float:
    """Ids in `split`'s packed stream (each document's pieces and its eos) per character
    of its text file (each document's characters and its line break). A character
    model's pieces are characters, but sentencepiece adds one word-start piece to each
    document: the ratio turns nats per piece into nats per character."""
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.data.lm import read_documents
    from aiayn.data.tokenizer import SentencePieceTokenizer

    documents = read_documents(PreparedCorpus.load(data), split)
    tokenizer = SentencePieceTokenizer.load(data / "spm.model")
    return _pieces_per_character(documents, tokenizer.encode_batch(documents))


def _pieces_per_character(documents: list[str], ids: list[list[int]]) -> float:
    """`pieces_per_character` of documents already read and encoded."""
    return sum(len(row) + 1 for row in ids) / sum(len(d) + 1 for d in documents)


def bits_per_character(nats_per_piece: float, data: Path, split: str) -> float:
    """A language model's loss in nats per piece as bits per character of `split`."""
    return nats_per_piece * pieces_per_character(data, split) / math.log(2)


def position_edges(length: int) -> list[int]:
    """Edges of the buckets of positions that the loss by position averages over: 0, 1,
    2, 4, ... doubling, then `length`. Position t predicts the next character from the
    t + 1 read so far, so the first bucket reads one character, and each later one
    reaches about twice as far back as the one before."""
    edges = [0, 1]
    while edges[-1] * 2 < length:
        edges.append(edges[-1] * 2)
    return [*edges, length]


def bucket_names(edges: list[int]) -> list[str]:
    """Each bucket of positions by name: "0", "2–3", ... (its first and last position)."""
    return [str(lo) if hi - lo == 1 else f"{lo}–{hi - 1}" for lo, hi in itertools.pairwise(edges)]


def nats_by_position(model, blocks, device: str):
    """The model's mean loss in nats at each position of packed `blocks` ((N, T + 1)
    ids: it reads block[:-1] and predicts block[1:]), over the blocks: a (T,) tensor.
    Every position counts once per block, so its mean is the mean loss per piece."""
    import torch
    import torch.nn.functional as F

    total = None
    with torch.no_grad():
        for chunk in blocks.split(4):
            chunk = chunk.to(device)
            logits = model(chunk[:, :-1]).float()  # (B, T, V)
            targets = chunk[:, 1:]
            nats = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, T)
            total = nats.sum(0) if total is None else total + nats.sum(0)
    return total.cpu().double() / len(blocks)


def bits_by_bucket(nats, edges: list[int], ratio: float) -> list[float]:
    """Mean nats per position (`nats_by_position`) as bits per character within each
    bucket of positions [edges[i], edges[i + 1]), by the split's pieces per character
    `ratio` (one ratio for every position)."""
    return [float(nats[lo:hi].mean()) * ratio / math.log(2) for lo, hi in itertools.pairwise(edges)]


def test_bits_per_char(run: Path, data: Path, device: str) -> tuple[float, int, dict]:
    """The run's best model (`best_model`) on `data`'s test split, packed into blocks
    as the language-model task packs them: bits per character, the pieces scored, and
    bits per character by position in the block ({"edges": bucket edges, "bpc": one per
    bucket}; `position_edges`, `bits_by_bucket`)."""
    import torch

    from aiayn.data.corpus import PreparedCorpus
    from aiayn.data.lm import pack, read_documents
    from aiayn.data.tokenizer import SentencePieceTokenizer

    model = best_model(run, device)
    tokenizer = SentencePieceTokenizer.load(run / "spm.model")
    texts = read_documents(PreparedCorpus.load(data), "test")
    documents = tokenizer.encode_batch(texts)
    blocks = torch.tensor(pack(documents, model.cfg.eos_id, model.cfg.max_len + 1, 1).blocks)
    nats = nats_by_position(model, blocks, device)
    ratio = _pieces_per_character(texts, documents)
    edges = position_edges(len(nats))
    by_position = {"edges": edges, "bpc": bits_by_bucket(nats, edges, ratio)}
    return float(nats.mean()) * ratio / math.log(2), nats.numel() * len(blocks), by_position


def worker(args: argparse.Namespace) -> None:
    """One run: train, score the test split, write RUN/result.json."""
    import resource

    import torch

    from aiayn.config.recipes import find_recipe
    from aiayn.training.trainer import train_from_recipe

    task = TASKS[args.task]
    run = args.workdir / f"{args.kernel}-seed{args.seed}"
    overrides = [
        f"data.corpus={args.data.resolve()}",
        f"model.attention={args.kernel}",
        f"train.seed={args.seed}",
        f"train.max_steps={args.steps}",
        *task.kernel_settings(args.kernel),
        *args.set,
    ]
    began = time.perf_counter()
    result = train_from_recipe(
        find_recipe(Path(task.recipe)), run, overrides, device=args.device, progress=False
    )
    seconds = time.perf_counter() - began
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open(encoding="utf-8")]
    valid = [r for r in rows if r.get("kind") == "valid"]
    per_s = [r["tgt_tokens_per_s"] for r in rows if r.get("kind") == "train"]
    if task.metric == "accuracy":
        accuracy, n_test = test_accuracy(run, args.data, args.device)
        accuracies = [r["accuracy"] for r in valid if "accuracy" in r]
        scores = dict(
            test_accuracy=100 * accuracy,
            test_texts=n_test,
            best_valid_accuracy=100 * max(accuracies) if accuracies else None,
            last_valid_accuracy=100 * accuracies[-1] if accuracies else None,
            texts_per_s=statistics.median(per_s) if per_s else None,
        )
    else:
        bpc, n_test, by_position = test_bits_per_char(run, args.data, args.device)
        losses = [r["loss"] for r in valid if "loss" in r]
        scores = dict(
            test_bpc=bpc,
            test_pieces=n_test,
            test_bpc_by_position=by_position,
            best_valid_bpc=bits_per_character(min(losses), args.data, "valid") if losses else None,
            tokens_per_s=statistics.median(per_s) if per_s else None,
        )
    if args.device.startswith("cuda"):
        peak_mib = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    record = dict(
        kernel=args.kernel,
        seed=args.seed,
        steps=result.steps,
        stopped=result.stopped,
        seconds=seconds,
        train_minutes=result.train_minutes,
        **scores,
        peak_mib=peak_mib,
        overrides=overrides,
    )
    (run / RESULT_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def mean_length(data: Path) -> float:
    """The training texts' mean length in ids, as the classify task cuts them (no cut here)."""
    from aiayn.data.tokenizer import SentencePieceTokenizer

    tokenizer = SentencePieceTokenizer.load(data / "spm.model")
    texts = (data / "train.text").read_text(encoding="utf-8").splitlines()
    return statistics.fmean(len(ids) for ids in tokenizer.encode_batch(texts))


def labels(data: Path, split: str) -> list[str]:
    """The class of each text of `split`, in order."""
    return (data / f"{split}.label").read_text(encoding="utf-8").splitlines()


def majority_share(data: Path, split: str) -> float:
    """The percentage of `split`'s texts whose label is its most common one: the
    accuracy of always answering that class."""
    classes = labels(data, split)
    return 100 * max(Counter(classes).values()) / len(classes)


def first_token_share(data: Path, split: str) -> float:
    """The accuracy on `split` of answering, for each text, the class most common in
    the training split after that text's first word (ListOps: the root operator, as
    MAX -> 9 and MIN -> 0)."""

    def firsts(name: str) -> list[str]:
        lines = (data / f"{name}.text").read_text(encoding="utf-8").splitlines()
        return [line.split()[0] for line in lines]

    seen: dict[str, Counter] = {}
    for first, label in zip(firsts("train"), labels(data, "train"), strict=True):
        seen.setdefault(first, Counter())[label] += 1
    guess = {first: counts.most_common(1)[0][0] for first, counts in seen.items()}
    pairs = list(zip(firsts(split), labels(data, split), strict=True))
    return 100 * sum(guess.get(first) == label for first, label in pairs) / len(pairs)


def naive_bayes_share(data: Path, split: str, n: int = 4) -> float:
    """The accuracy on `split` of a naive Bayes classifier over character n-grams, fit on
    the training split with add-one smoothing: a model that reads the whole text, with
    no attention and no training steps."""
    grams: dict[str, Counter] = {}
    train = (data / "train.text").read_text(encoding="utf-8").splitlines()
    for text, label in zip(train, labels(data, "train"), strict=True):
        grams.setdefault(label, Counter()).update(text[i : i + n] for i in range(len(text) - n + 1))
    prior = Counter(labels(data, "train"))
    vocabulary = len(set().union(*grams.values()))
    totals = {label: sum(counts.values()) + vocabulary for label, counts in grams.items()}

    def guess(text: str) -> str:
        seen = Counter(text[i : i + n] for i in range(len(text) - n + 1))
        return max(
            grams,
            key=lambda c: (
                math.log(prior[c])
                + sum(k * math.log((grams[c][g] + 1) / totals[c]) for g, k in seen.items())
            ),
        )

    texts = (data / f"{split}.text").read_text(encoding="utf-8").splitlines()
    pairs = list(zip(texts, labels(data, split), strict=True))
    return 100 * sum(guess(text) == label for text, label in pairs) / len(pairs)


def unigram_bpc(data: Path, split: str) -> float:
    """Bits per character on `split` of the training text's character frequencies (a
    line break ends each document; a character the training text lacks counts once):
    what a model that reads no context scores."""
    train = Counter((data / "train.en").read_text(encoding="utf-8"))
    text = (data / f"{split}.en").read_text(encoding="utf-8")
    total = sum(train.values()) + len(set(text) - set(train))
    bits = sum(-math.log2(train.get(c, 1) / total) for c in text)
    return bits / len(text)


def baselines(task: str, data: Path) -> dict[str, dict[str, float]]:
    """The scores of answering without reading the context, per split."""
    splits = ("valid", "test")
    if TASKS[task].metric == "bpc":
        return {"unigram_bpc": {s: unigram_bpc(data, s) for s in splits}}
    out = {"majority_accuracy": {s: majority_share(data, s) for s in splits}}
    if task == "listops":
        out["first_token_accuracy"] = {s: first_token_share(data, s) for s in splits}
    else:
        out["naive_bayes_accuracy"] = {s: naive_bayes_share(data, s) for s in splits}
    return out


def plot_positions(record: dict, out: Path) -> Path:
    """Draw a language-model results file's test bits per character against position in
    the block, one line per kernel (the mean over its seeds), beside the unigram's
    level: which kernel's loss still falls where the context is far. Written to `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4))
    edges = None
    for kernel, s in record["kernels"].items():
        curve = s["test_bpc_by_position"]
        edges = curve["edges"]
        seeds = len(s["seeds"])
        label = f"{kernel} ({seeds} seed{'s' if seeds > 1 else ''})"
        axes.plot(range(len(curve["bpc"])), curve["bpc"], marker="o", label=label)
    unigram = record["baselines"]["unigram_bpc"]["test"]
    axes.axhline(unigram, color="grey", linestyle="--", label=f"unigram {unigram:.2f}")
    axes.set_xticks(range(len(edges) - 1), bucket_names(edges), rotation=30)
    axes.set_xlabel("position t in the block (the prediction reads t + 1 characters)")
    axes.set_ylabel("test bits per character")
    axes.set_title(f"Bits per character by position: {record['recipe']}")
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes, clear of the lines
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def recipe_context(recipe: str) -> int:
    """The context (model.max_len) of a packaged recipe."""
    from aiayn.config.recipes import find_recipe
    from aiayn.training.recipe import load_recipe

    return int(load_recipe(find_recipe(Path(recipe))).model["max_len"])


def launch(args: argparse.Namespace) -> list[dict]:
    """Every (kernel, seed) run as a worker process, --parallel at a time; their records.
    With --reuse, a run whose result is in --workdir already is read, not run again;
    with --collect too, and the others are left out (a sweep cut short)."""
    jobs = [(k, s) for s in args.seeds for k in args.kernels]
    running: list[tuple[str, int, subprocess.Popen, object]] = []
    records = []
    base = [sys.executable, "-m", "benchmarks.bench_efficient", "--worker"]
    shared = ["--task", args.task, "--device", args.device, "--data", str(args.data)]
    shared += ["--workdir", str(args.workdir), "--steps", str(args.steps)]
    shared += [item for value in args.set for item in ("--set", value)]
    metric = TASKS[args.task].metric
    while jobs or running:
        while jobs and len(running) < args.parallel:
            kernel, seed = jobs.pop(0)
            done = args.workdir / f"{kernel}-seed{seed}" / RESULT_FILE
            if args.reuse and done.is_file():
                records.append(json.loads(done.read_text(encoding="utf-8")))
                print(f"reused {kernel} seed {seed}: {done}", flush=True)
                continue
            if args.collect:
                print(f"not run {kernel} seed {seed}: --collect trains nothing", flush=True)
                continue
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
                score = r[f"test_{metric}"]
                print(
                    f"done {kernel} seed {seed}: test {metric} {score:.2f}, "
                    f"{r['steps']} updates in {r['seconds']:.0f} s",
                    flush=True,
                )
            else:
                print(f"FAILED {kernel} seed {seed} (exit {process.returncode}): see its log")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="listops")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--kernels", default=None, help="default: every kernel the task takes")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=1500, help="updates per run (equal budget)")
    parser.add_argument("--data", type=Path, required=True, help="the task's data set")
    parser.add_argument("--scale", type=float, default=0.1, help="ListOps, if to be generated")
    parser.add_argument("--set", action="append", default=[], help="one more recipe override")
    parser.add_argument("--parallel", type=int, default=15, help="runs at a time")
    parser.add_argument("--workdir", type=Path, default=Path("runs/bench-efficient"))
    parser.add_argument("--results", default=None, help="default: efficient-TASK")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="read the runs whose result.json is in --workdir instead of running them again",
    )
    parser.add_argument(
        "--collect",
        action="store_true",
        help="--reuse and train nothing: write the results of the runs finished in --workdir",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="draw --results' loss by position (a language model's) to this PNG; no runs",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kernel", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.reuse = args.reuse or args.collect
    args.results = args.results or f"efficient-{args.task}"
    if args.plot is not None:
        record = json.loads((common.RESULTS / f"{args.results}.json").read_text("utf-8"))
        return print(f"wrote {plot_positions(record, args.plot)}")
    if args.worker:
        args.seed = args.seeds[0]
        return worker(args)
    task = TASKS[args.task]
    args.kernels = args.kernels.split(",") if args.kernels else list(task.kernels)
    unknown = sorted(set(args.kernels) - set(task.kernels))
    if unknown:
        parser.error(f"--kernels: {unknown} cannot run {args.task}; choose from {task.kernels}")
    if args.device.startswith("cuda"):
        import torch  # noqa: F401 (imported here, so the results file names the GPU)
    write_data(args.task, args.data, args.scale)
    args.workdir.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    runs = launch(args)
    wall = time.perf_counter() - began
    if not runs:
        sys.exit(f"every run failed: see their logs in {args.workdir}")
    manifest = {}
    if task.metric == "accuracy":
        length = mean_length(args.data)
        for r in runs:
            r["tokens_per_s"] = None if r["texts_per_s"] is None else r["texts_per_s"] * length
        from aiayn.data import bible_books, listops

        manifest_file = {"listops": listops.MANIFEST, "bible-genre": bible_books.MANIFEST}
        manifest = json.loads((args.data / manifest_file[args.task]).read_text("utf-8"))
    runs.sort(key=lambda r: (KERNELS.index(r["kernel"]), r["seed"]))
    summary = summarise(runs)
    context = recipe_context(task.recipe) if task.metric == "bpc" else None
    where = f"the English Bible, blocks of {context:,}" if context else args.task
    # the workers inherit the launcher's environment: OMP_NUM_THREADS sets their threads
    threads = os.environ.get("OMP_NUM_THREADS") if args.device == "cpu" else None
    device = f"one {common.gpu_name() or args.device}" if args.device != "cpu" else "the CPU"
    payload = {
        "measures": [
            {
                "system": f"{', '.join(args.kernels)}: {args.task}",
                "cell": f"{where}, {args.steps:,} updates each, {device}"
                + (f", {threads} thread(s) a run" if threads else ""),
                "harness": f"bench_efficient, {args.parallel} runs at a time",
            }
        ],
        "threads": int(threads) if threads and threads.isdigit() else None,
        "task": args.task,
        "metric": task.metric,
        "recipe": task.recipe,
        "args": {k: str(v) for k, v in vars(args).items()},
        "data": manifest,
        **({"mean_train_tokens": length} if task.metric == "accuracy" else {}),
        "baselines": baselines(args.task, args.data),
        **({"context": context} if context else {}),
        "shared_device": f"{args.parallel} runs at a time on one {args.device}",
        "wall_seconds": wall,
        "kernels": summary,
        "runs": runs,
    }
    if args.task == "listops":
        payload["lra_listops"] = {
            k: {"model": m, "accuracy": a} for k, (m, a) in LRA_LISTOPS.items()
        }
    metric = task.metric
    rows = [
        [
            kernel,
            f"{s[f'test_{metric}']:.2f} ± {s[f'test_{metric}_std']:.2f}",
            f"{s[f'best_valid_{metric}']:.2f}" if f"best_valid_{metric}" in s else "—",
            f"{s['steps']:,.0f}",
            f"{s['tokens_per_s']:,.0f}" if "tokens_per_s" in s else "—",
            f"{s['peak_mib']:,.0f}",
        ]
        for kernel, s in summary.items()
    ]
    headers = ["kernel", f"test {metric}", f"best valid {metric}", "updates", "tokens/s"]
    print(common.table([*headers, "peak MiB"], rows))
    print(f"baselines: {payload['baselines']}")
    print(f"written {common.write_json(args.results, payload)}")
    if len(runs) < len(args.kernels) * len(args.seeds) and not args.collect:
        sys.exit("some runs failed: see their logs in the work directory")


if __name__ == "__main__":
    main()
