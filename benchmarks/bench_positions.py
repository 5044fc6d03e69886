"""Position schemes compared: length extrapolation on a toy task, and the Bible recipe.

    python -m benchmarks.bench_positions extrapolation [--task copy] [--quick]
    python -m benchmarks.bench_positions bible [--minutes 15] [--parallel 2]

extrapolation: for each scheme, the same small encoder-decoder (ModelConfig.tiny,
dropout 0) is trained from the same seed on the same batches to reverse (or copy)
sequences of 1..--train-max symbols, for a fixed number of steps, on one thread. Then
`greedy_search` over `freeze(model)` decodes held-out sequences (drawn from their own
seed; the shortest lengths have few distinct sequences, so in-distribution sets overlap
the training data) of uniform length 1..--train-max, and of each length in
--test-lengths; the score is exact match, the share of outputs equal to the target.
Learned positions have untrained rows past the training lengths and `none` sees its
source as a bag of symbols (it cannot reverse at all): their failures are the result,
not a bug. Sources end with eos, as `aiayn.apps.translate` encodes sentences.

bible: `aiayn quickstart` once per scheme (`--set model.positional=SCHEME`), --parallel
runs at a time with one thread each, as the recipe was measured; the corpus is prepared
once, before any run, and copied into each run's directory. Collects test BLEU, chrF,
steps, epochs and parameters from each run's results.json.

Both write their key ("extrapolation", "bible") of benchmarks/results/positions.json,
leaving the other key as it is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import common

SCHEMES = ("sinusoidal", "learned", "rotary", "relative", "alibi", "none")
# Part B's order: with two runs side by side, the most informative pairs finish first.
BIBLE_ORDER = ("sinusoidal", "rotary", "relative", "alibi", "learned", "none")
PAD, BOS, EOS = 0, 1, 2  # ModelConfig's default ids; symbols are 3 .. vocab_size - 1
RESULTS_FILE = common.RESULTS / "positions.json"


# ----- part A: length extrapolation ------------------------------------------------------


def sample_batch(generator, lengths: list[int], vocab_size: int, task: str):
    """(src, tgt_in, tgt_out) for sequences of the given lengths, padded with PAD.

    src is the symbols then eos; the target is the symbols (reversed for "reverse"),
    tgt_in = bos + target and tgt_out = target + eos.
    """
    import torch

    longest = max(lengths) + 1
    src = torch.full((len(lengths), longest), PAD, dtype=torch.long)
    tgt_in, tgt_out = src.clone(), src.clone()
    for row, length in enumerate(lengths):
        symbols = torch.randint(3, vocab_size, (length,), generator=generator)
        target = symbols.flip(0) if task == "reverse" else symbols
        src[row, : length + 1] = torch.cat([symbols, torch.tensor([EOS])])
        tgt_in[row, : length + 1] = torch.cat([torch.tensor([BOS]), target])
        tgt_out[row, : length + 1] = torch.cat([target, torch.tensor([EOS])])
    return src, tgt_in, tgt_out


def uniform_lengths(generator, count: int, longest: int) -> list[int]:
    import torch

    return torch.randint(1, longest + 1, (count,), generator=generator).tolist()


def train_scheme(scheme: str, args: argparse.Namespace):
    """The model of `scheme` after args.steps steps, and the training seconds."""
    import torch

    from aiayn import ModelConfig, Transformer
    from aiayn.training.loss import label_smoothed_cross_entropy

    torch.manual_seed(args.seed)
    cfg = ModelConfig.tiny(
        vocab_size=args.vocab_size, dropout=0.0, max_len=args.max_len, positional=scheme
    )
    model = Transformer(cfg).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9)

    def rate(step: int) -> float:  # linear warmup, then cosine decay to zero
        if step < args.warmup:
            return (step + 1) / args.warmup
        return 0.5 * (1 + math.cos(math.pi * (step - args.warmup) / (args.steps - args.warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    data = torch.Generator().manual_seed(args.seed)  # the same batches for every scheme
    started = time.perf_counter()
    for step in range(args.steps):
        lengths = uniform_lengths(data, args.batch, args.train_max)
        src, tgt_in, tgt_out = sample_batch(data, lengths, args.vocab_size, args.task)
        out = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, PAD, args.smoothing)
        optimizer.zero_grad(set_to_none=True)
        (out.loss / out.n_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if (step + 1) % args.log_every == 0:
            per_token = out.loss.item() / out.n_tokens
            print(f"  {scheme} step {step + 1}: loss {per_token:.3f}", file=sys.stderr)
    return model.eval(), time.perf_counter() - started


def agreement(output: list[int], target: list[int]) -> float:
    """Share of positions where output and target agree, over the longer of the two."""
    same = sum(a == b for a, b in zip(output, target, strict=False))
    return same / max(len(output), len(target))


def score_test(fast, test: str, args: argparse.Namespace) -> tuple[float, float]:
    """Exact match and token agreement (%) of greedy outputs on one held-out test set.

    test is "in" (lengths uniform in 1 .. args.train_max) or a length.
    """
    import torch

    from aiayn.inference.search import greedy_search

    seed = args.seed + 1 + (0 if test == "in" else int(test))  # the same set for every scheme
    data = torch.Generator().manual_seed(seed)
    if test == "in":
        lengths = uniform_lengths(data, args.test_size, args.train_max)
    else:
        lengths = [int(test)] * args.test_size
    src, _, tgt_out = sample_batch(data, lengths, args.vocab_size, args.task)
    exact, agree = 0, 0.0
    with torch.inference_mode():
        for first in range(0, args.test_size, args.decode_batch):
            rows = slice(first, first + args.decode_batch)
            found = greedy_search(fast, src[rows], extra_len=args.extra_len)
            for hypotheses, target, length in zip(found, tgt_out[rows], lengths[rows], strict=True):
                output, target = hypotheses[0].tokens, target[:length].tolist()
                exact += output == target
                agree += agreement(output, target)
    return 100.0 * exact / args.test_size, 100.0 * agree / args.test_size


def run_extrapolation(args: argparse.Namespace) -> None:
    import torch

    from aiayn import freeze

    torch.set_num_threads(1)
    if args.quick:
        args.steps, args.test_size = 300, 50
    tests = ["in", *args.test_lengths.split(",")]
    args.max_len = max(512, max(int(t) for t in tests[1:]) + args.extra_len + 2)
    records = []
    for scheme in args.schemes.split(","):
        model, seconds = train_scheme(scheme, args)
        fast = freeze(model)
        scores = {test: score_test(fast, test, args) for test in tests}
        records.append(
            dict(
                scheme=scheme,
                train_seconds=round(seconds, 1),
                exact_match={t: round(exact, 1) for t, (exact, _) in scores.items()},
                token_agreement={t: round(agree, 1) for t, (_, agree) in scores.items()},
            )
        )
        print(f"{scheme}: {scores} (exact, agreement), {seconds:.0f} s", file=sys.stderr)

    headers = ["scheme", *(f"1-{args.train_max} (in)" if t == "in" else t for t in tests)]
    print(
        f"\nExact match (%) of greedy {args.task} of {args.test_size} held-out sequences per "
        f"length, trained on lengths 1-{args.train_max}: {args.steps} steps of {args.batch}; "
        f"{common.machine()}, 1 thread\n"
    )
    rows = [
        [r["scheme"], *(f"{v:.1f}" for v in r["exact_match"].values()), r["train_seconds"]]
        for r in records
    ]
    print(common.table([*headers, "train s"], rows))
    print("\nToken agreement (%): positions where output and target agree, over the longer\n")
    rows = [[r["scheme"], *(f"{v:.1f}" for v in r["token_agreement"].values())] for r in records]
    print(common.table(headers, rows))
    settings = {
        k: v
        for k, v in vars(args).items()
        if k not in ("part", "quick", "log_every", "results", "schemes")
    }
    settings["model"] = "ModelConfig.tiny: d_model 64, 4 heads, d_ff 256, 2+2 layers, dropout 0"
    settings["optimizer"] = "Adam (0.9, 0.98), linear warmup then cosine decay, clip 1.0"
    path = update_results(
        "extrapolation", {"settings": settings, "threads": 1, "results": records}, args.results
    )
    print(f"\nwritten {path}")


# ----- part B: the Bible recipe ------------------------------------------------------------


def prepare_corpus(directory: Path) -> None:
    """The quickstart's Bible corpus in `directory`, prepared unless it already is."""
    from aiayn.apps.quickstart import prepared_bible
    from aiayn.data.prepare import BIBLE_VOCAB_SIZE

    prepared_bible(directory, BIBLE_VOCAB_SIZE, print)


def launch(scheme: str, corpus: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, Any]:
    """Start `aiayn quickstart` for `scheme` in args.out/SCHEME, with its own log."""
    import aiayn

    out = args.out / scheme
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "data").exists():  # the quickstart reuses a prepared corpus found here
        shutil.copytree(corpus, out / "data")
    command = [
        sys.executable,
        "-m",
        "aiayn.cli",
        "quickstart",
        "--out",
        str(out),
        "--minutes",
        str(args.minutes),
        "--device",
        "cpu",
        "--set",
        f"model.positional={scheme}",
    ]
    if args.test_pairs:
        command += ["--test-pairs", str(args.test_pairs)]
    threads = str(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    log = (out / "quickstart.log").open("w")
    print(f"{time.strftime('%H:%M:%S')} start {scheme}: {' '.join(command)}", flush=True)
    repository = Path(aiayn.__file__).resolve().parents[2]  # where configs/ lies
    process = subprocess.Popen(
        command, cwd=repository, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
    )
    return process, log


def collect(scheme: str, returncode: int, wall: float, args: argparse.Namespace) -> dict:
    """The figures of one finished run (or its error and the end of its log)."""
    out = args.out / scheme
    record: dict[str, Any] = {"scheme": scheme, "wall_minutes": round(wall / 60, 1)}
    results = out / "results.json"
    if returncode != 0 or not results.is_file():
        tail = (out / "quickstart.log").read_text(errors="replace")[-2000:]
        return {**record, "error": f"exit status {returncode}", "log_tail": tail}
    found = json.loads(results.read_text())
    keys = ("bleu", "chrf", "steps", "epochs", "train_minutes", "parameters", "test_pairs")
    return {
        **record,
        **{k: found[k] for k in keys},
        "translate_seconds": found["translate_seconds"],
    }


def bible_table(records: list[dict]) -> str:
    rows = []
    for r in records:
        if "error" in r:
            rows.append([r["scheme"], r["error"], "", "", "", "", ""])
        else:
            rows.append(
                [
                    r["scheme"],
                    f"{r['bleu']:.2f}",
                    f"{r['chrf']:.2f}",
                    f"{r['steps']:,}",
                    f"{r['epochs']:.2f}",
                    f"{r['parameters']:,}",
                    f"{r['train_minutes']:.1f}",
                ]
            )
    headers = ["scheme", "test BLEU", "chrF", "steps", "epochs", "parameters", "train min"]
    return common.table(headers, rows)


def run_bible(args: argparse.Namespace) -> None:
    args.out = args.out.resolve()
    schemes = args.schemes.split(",")
    corpus = (args.corpus or args.out / "corpus").resolve()
    prepare_corpus(corpus)  # once, before any run: parallel runs must not both prepare it
    waiting, running, records = list(schemes), {}, {}
    settings = {
        "command": "aiayn quickstart --out OUT/SCHEME --minutes M --device cpu "
        "--set model.positional=SCHEME",
        "recipe": "configs/bible-en-es-cpu.yaml",
        "minutes": args.minutes,
        "parallel_runs": args.parallel,
        "threads_per_run": args.threads,
        "test_pairs": args.test_pairs or "all",
        "out": str(args.out),
        "corpus": str(corpus),
    }
    while waiting or running:
        while waiting and len(running) < args.parallel:
            scheme = waiting.pop(0)
            running[scheme] = (*launch(scheme, corpus, args), time.perf_counter())
        time.sleep(5)
        for scheme, (process, log, started) in list(running.items()):
            if process.poll() is None:
                continue
            log.close()
            del running[scheme]
            records[scheme] = collect(
                scheme, process.returncode, time.perf_counter() - started, args
            )
            print(f"{time.strftime('%H:%M:%S')} done {scheme}: {records[scheme]}", flush=True)
            ordered = [records[s] for s in schemes if s in records]
            update_results("bible", {"settings": settings, "results": ordered}, args.results)

    ordered = [records[s] for s in schemes]
    print(
        f"\nThe Bible recipe (English -> Spanish, test set, beam 4 after averaging 3 "
        f"checkpoints), {args.minutes:g} minutes per scheme, {args.parallel} runs side by "
        f"side, {args.threads} thread each; {common.machine()}\n"
    )
    print(bible_table(ordered))
    path = update_results("bible", {"settings": settings, "results": ordered}, args.results)
    print(f"\nwritten {path}")


# ----- results and command line ------------------------------------------------------------


def library() -> dict[str, str]:
    """Where the aiayn under test lies, and its checkout's commit (if it is one)."""
    import aiayn

    repository = Path(aiayn.__file__).resolve().parents[2]
    found = subprocess.run(
        ["git", "-C", str(repository), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    )
    return {"path": str(repository), "commit": found.stdout.strip() or "unknown"}


def update_results(key: str, payload: dict[str, Any], path: Path) -> Path:
    """Write `key` of the results file (with the date and machine), keeping its other keys."""
    from aiayn.data.files import write_atomic

    results = json.loads(path.read_text()) if path.is_file() else {}
    results[key] = {
        **common.provenance(),
        "library": library(),
        **payload,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(results, indent=1) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS_FILE, help="JSON to update")
    parts = parser.add_subparsers(dest="part", required=True)

    a = parts.add_parser("extrapolation", help="part A: train short, test long")
    a.add_argument("--task", choices=("reverse", "copy"), default="reverse")
    a.add_argument("--schemes", default=",".join(SCHEMES))
    a.add_argument("--vocab-size", type=int, default=24, help="symbols are 3 .. V-1")
    a.add_argument("--train-max", type=int, default=32, help="train on lengths 1 .. this")
    a.add_argument("--test-lengths", default="64,128", help="besides in-distribution")
    a.add_argument("--steps", type=int, default=1000)
    a.add_argument("--batch", type=int, default=64)
    a.add_argument("--lr", type=float, default=2e-3)
    a.add_argument("--warmup", type=int, default=100)
    a.add_argument("--smoothing", type=float, default=0.0)
    a.add_argument("--test-size", type=int, default=200, help="sequences per test length")
    a.add_argument("--decode-batch", type=int, default=100)
    a.add_argument("--extra-len", type=int, default=8, help="output may exceed the source by")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--log-every", type=int, default=250)
    a.add_argument("--quick", action="store_true", help="300 steps, 50 sequences per length")

    b = parts.add_parser("bible", help="part B: the quickstart once per scheme")
    b.add_argument("--schemes", default=",".join(BIBLE_ORDER))
    b.add_argument("--out", type=Path, default=Path("/tmp/posruns"))
    b.add_argument("--corpus", type=Path, default=None, help="prepared here (default OUT/corpus)")
    b.add_argument("--minutes", type=float, default=15.0)
    b.add_argument("--parallel", type=int, default=2, help="runs at a time")
    b.add_argument("--threads", type=int, default=1, help="per run")
    b.add_argument("--test-pairs", type=int, default=None, help="score only the first N")

    args = parser.parse_args()
    if args.part == "extrapolation":
        run_extrapolation(args)
    else:
        run_bible(args)


if __name__ == "__main__":
    main()
