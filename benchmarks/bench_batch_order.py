"""What a server's batches cost against a sorted file: the same verses, decoded in batches
of B taken in arrival order (as a server forms them) and in batches of B sorted by length.

    python -m benchmarks.bench_batch_order --run RUN [--batches 16,32,64] [--beam 4]
        [--threads 1] [--rounds 3] [--results batch-order]

Issue 44's serving goal measures the server at 64 clients against the scheduling limit
(`bench_serve --offline`): every test verse once through `aiayn translate`, which sorts
the whole file by length into batches of 4096 tokens. A server holds only the sentences
its clients have sent: at 64 clients, at most 64, in the order they came, of any lengths.
This benchmark separates the two costs in one process (one model, loaded once; no HTTP,
no clients):

- `arrival`: the verses shuffled (seed = the round), cut into batches of B in that order,
  each batch one call of `Translator.translate` (one batched beam search);
- `sorted`: the verses sorted by length, cut into batches of B, each one call;
- `file`: all the verses in one call, batched as `aiayn translate` does (sorted, 4096
  source tokens a batch): the scheduling limit without start and loading.

The three take turns within each round, after one warm-up pass; the median of the rounds
is reported, in sentences per second, with each cell's ratio to `file`. Outputs are the
same search, so only the order and size of the batches differ; lines are not compared.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import common


def batches_of(sentences: list[str], size: int, order: str, seed: int) -> list[list[str]]:
    """`sentences` cut into consecutive batches of `size`, in `order`: "arrival" (shuffled
    with `seed`) or "sorted" (by length, shortest first; ties keep the file's order)."""
    if size < 1:
        raise ValueError(f"a batch holds at least one sentence, got {size}")
    if order == "arrival":
        ordered = list(sentences)
        random.Random(seed).shuffle(ordered)
    elif order == "sorted":
        ordered = sorted(sentences, key=len)
    else:
        raise ValueError(f"unknown order {order!r}: arrival or sorted")
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def rate(translate: Callable[[list[str]], object], batches: list[list[str]]) -> float:
    """Sentences a second over `batches`, each one call of `translate`."""
    began = time.perf_counter()
    for batch in batches:
        translate(batch)
    return sum(map(len, batches)) / (time.perf_counter() - began)


def main() -> None:
    import torch

    from aiayn.apps.translate import Translator
    from aiayn.data.files import read_lines

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--batches", default="16,32,64", help="batch sizes B, in turn")
    parser.add_argument("--beam", type=int, default=4, help="the servers' beam")
    parser.add_argument("--threads", type=int, default=1, help="the servers' torch threads")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", default="batch-order")
    args = parser.parse_args()
    sizes = [int(part) for part in args.batches.split(",")]
    common.set_threads(args.threads)
    translator = Translator.load(args.run, dtype=torch.float32)
    sentences = read_lines(common.test_files(args.run)[0])

    def one_batch(batch: list[str]) -> object:
        return translator.translate(batch, beam=args.beam, max_tokens=None)  # one search

    def as_a_file(batch: list[str]) -> object:
        return translator.translate(batch, beam=args.beam)  # aiayn translate's batching

    rate(one_batch, batches_of(sentences, 32, "arrival", 0))  # warm-up
    rates: dict[tuple[str, int], list[float]] = {}
    for round_ in range(args.rounds):
        rates.setdefault(("file", len(sentences)), []).append(rate(as_a_file, [sentences]))
        for size in sizes:
            for order in ("arrival", "sorted"):
                batches = batches_of(sentences, size, order, seed=round_)
                rates.setdefault((order, size), []).append(rate(one_batch, batches))
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    limit = statistics.median(rates[("file", len(sentences))])
    cells = [
        dict(order=order, batch=size, sentences_per_s=statistics.median(values),
             rounds_per_s=values, vs_file=statistics.median(values) / limit)
        for (order, size), values in rates.items()
    ]  # fmt: skip
    rows = [[c["order"], c["batch"], f"{c['sentences_per_s']:.1f}", f"{c['vs_file']:.2f}x"]
            for c in cells]  # fmt: skip
    print(common.table(["order", "batch", "sentences/s", "vs file"], rows))
    path = common.write_json(
        args.results,
        {
            "measures": [
                {
                    "system": "aiayn Translator.translate, float32, batches in arrival "
                    "order and sorted by length, against the whole file",
                    "cell": f"{args.run}, its test split, beam {args.beam}, "
                    f"{args.threads} thread(s), {common.machine()}",
                    "harness": "bench_batch_order",
                }
            ],
            "run": str(args.run),
            "sentences": len(sentences),
            "beam": args.beam,
            "threads": args.threads,
            "rounds": args.rounds,
            "method": "one process, the model loaded once; each round: the whole file "
            "(aiayn translate's sorted batches of 4096 tokens), then for each B the "
            "verses shuffled (seed = round) and sorted by length, cut into batches of B, "
            "one batched beam search each; median of the rounds",
            "cells": cells,
        },
    )
    print(f"written {path}")


if __name__ == "__main__":
    main()
