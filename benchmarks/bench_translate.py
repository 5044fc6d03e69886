"""`aiayn translate` of a whole file: fixed batches against the continuous-batching engine.

    python -m benchmarks.bench_translate --run RUN [--threads 2,1] [--rounds 2]

The test split of RUN's corpus (the quickstart's: 296 verses), beam 8 and alpha 1.0
(the quickstart's scoring), translated by the command a user runs, each system a
`python -m aiayn translate` process of its own, timed from start to exit (loading
included, the same for every system):

- `batches`: today's default, sentences sorted by length and cut into batches of
  `--max-tokens` 4096 source tokens, each decoded until its longest sentence ends;
- `continuous-N`: `--continuous N`, N sentences at once, each taking a free slot at
  the next step as another finishes;
- `continuous-compiled-N`: the same with `--compile` (its compilation inside the time);
- `default`: no option at all, what a user gets: the decoder `aiayn translate` chooses
  from the committed measurements (`aiayn.apps.decoder_choice`) and `--dtype auto` (the
  faster of float32 and bfloat16, timed on the first batch);
- `SYSTEM:DTYPE` (`batches:bfloat16`, `continuous-32:int8`): SYSTEM in that `--dtype`;
- with `--baseline DIR` (a checkout of an earlier commit, e.g. a `git worktree`), also
  `batches@COMMIT`: that checkout's `aiayn translate` in sorted batches, float32.

Every other system runs in float32 (AIAYN_DTYPE), settings fixed before the run. The
values of N are fixed before the run (default 8 and 32). The systems take turns round
by round, one process at a time, no OpenMP wait policy forced. Reported: sentences/s
(median over rounds), the ratio to `batches`, BLEU of each output against the
references (sacreBLEU), and how many lines equal `batches`' output. Each round also
times every system on the file's first sentence alone (start, loading and one
sentence), giving its start-up time and the rate of its decoding alone: (sentences - 1)
over the whole file's time less that. Writes results/translate.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from benchmarks import common

SYSTEMS = ("batches", "continuous-8", "continuous-32", "continuous-compiled-32")
DTYPES = ("float32", "bfloat16", "int8")


def options(system: str) -> list[str]:
    """The `aiayn translate` options of `system` (see the module's list), without its
    dtype and baseline.

    Raises:
        ValueError: a system that is none of those.
    """
    name, _, dtype = system.partition(":")
    name = name.partition("@")[0]
    if dtype and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} in {system!r}: one of {', '.join(DTYPES)}")
    if name in ("batches", "default"):
        if name == "default" and dtype:
            raise ValueError("the default system takes no dtype: it is --dtype auto")
        return []
    kind, _, slots = name.rpartition("-")
    if kind not in ("continuous", "continuous-compiled") or not slots.isdigit():
        raise ValueError(
            f"unknown system {system!r}: batches, continuous-N, continuous-compiled-N, "
            "default, with :DTYPE"
        )
    return ["--continuous", slots, *(["--compile"] if kind == "continuous-compiled" else [])]


def environment(system: str, threads: int, baselines: dict[str, Path]) -> dict[str, str]:
    """The environment of `system`'s process: its threads, its dtype (float32 unless it
    names one; none for `default`) and, for `batches@COMMIT`, that checkout's sources."""
    # one process at a time, each exited before the next starts: no wait policy forced
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    name, _, dtype = system.partition(":")
    env.pop("AIAYN_DTYPE", None)
    if name != "default":
        # settings fixed before the run, not `--dtype auto`'s timing (issue 41), which
        # may pick bf16 run to run
        env["AIAYN_DTYPE"] = dtype or "float32"
    if "@" in name:
        checkout = baselines[name.partition("@")[2]]
        env["PYTHONPATH"] = os.pathsep.join([str(checkout / "src"), str(checkout)])
    return env


def baseline_systems(paths: list[Path]) -> dict[str, Path]:
    """{short commit: checkout} of each `--baseline` checkout."""
    found = {}
    for path in paths:
        commit = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        found[commit] = path.resolve()
    return found


def main() -> None:
    import sacrebleu

    from aiayn.data.files import read_lines

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--beam", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--threads", default="2", help="thread counts, in turn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--results", default="translate")
    parser.add_argument(
        "--baseline", type=Path, action="append", default=[],
        help="a checkout of an earlier commit: adds its `batches` as batches@COMMIT",
    )  # fmt: skip
    args = parser.parse_args()
    systems = args.systems.split(",")
    for system in systems:
        options(system)  # an unknown name fails before anything runs
    baselines = baseline_systems(args.baseline)
    systems += [f"batches@{commit}" for commit in baselines]
    source, reference = common.test_files(args.run)
    refs = read_lines(reference)
    sources = read_lines(source)
    n = len(sources)
    search = ["--beam", str(args.beam), "--alpha", str(args.alpha)]
    cells, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        first = Path(tmp) / "first.txt"
        first.write_text(sources[0] + "\n", encoding="utf-8")
        for threads in (int(t) for t in args.threads.split(",")):
            times = {s: [] for s in systems}
            starts = {s: [] for s in systems}
            outputs = {}
            for r in range(args.rounds):
                for system in systems[r % len(systems) :] + systems[: r % len(systems)]:
                    out = Path(tmp) / f"{system}-{threads}.txt"
                    env = environment(system, threads, baselines)
                    command = search + options(system)
                    times[system].append(common.time_translate(args.run, source, out, command, env))
                    outputs[system] = read_lines(out)
                    # start, loading and one sentence: what the whole file's time includes
                    starts[system].append(common.time_translate(args.run, first, out, command, env))
            base = outputs.get("batches")
            for system in systems:
                seconds = common.median(times[system])
                bleu = sacrebleu.corpus_bleu(outputs[system], [refs]).score
                same = (
                    None
                    if base is None
                    else sum(a == b for a, b in zip(outputs[system], base, strict=True))
                )
                ratio = (
                    common.median(
                        [b / s for b, s in zip(times["batches"], times[system], strict=True)]
                    )
                    if "batches" in times
                    else None
                )
                cell = dict(
                    threads=threads,
                    system=system,
                    sentences=n,
                    seconds=seconds,
                    times_s=times[system],
                    sentences_per_s=n / seconds,
                    speedup_vs_batches=ratio,
                    start_s=common.median(starts[system]),
                    decoding_sentences_per_s=common.median(
                        [
                            common.decoding_rate(n, w, o)
                            for w, o in zip(times[system], starts[system], strict=True)
                        ]
                    ),
                    bleu=bleu,
                    same_as_batches=same,
                )
                cells.append(cell)
                rows.append(
                    [threads, system, f"{n / seconds:.2f}", f"{seconds:.1f}",
                     "" if ratio is None else f"{ratio:.2f}x", f"{bleu:.2f}",
                     "" if same is None else f"{same}/{n}"]
                )  # fmt: skip
    headers = ["threads", "system", "sentences/s", "seconds", "vs batches", "BLEU", "same"]
    print(common.table(headers, rows))
    path = common.write_json(
        args.results,
        {
            "measures": [
                {
                    "system": f"aiayn translate of a file: {', '.join(systems)}",
                    "cell": f"{args.run}, its test split, beam {args.beam}, alpha "
                    f"{args.alpha:g}, {args.threads} thread(s), {common.machine()}",
                    "harness": "bench_translate",
                }
            ],
            "run": str(args.run),
            "threads": args.threads,  # its processes' own: taken off the load after the run
            "beam": args.beam,
            "alpha": args.alpha,
            "rounds": args.rounds,
            "method": "each system a `python -m aiayn translate` process, timed start to exit, "
            "taking turns round by round (order rotated), one process at a time, no "
            "OpenMP wait policy forced; float32 unless a system names its dtype, "
            "`default` with none (--dtype auto) and the decoder aiayn chooses",
            "baselines": {commit: str(path) for commit, path in baselines.items()},
            "cells": cells,
        },
    )
    print(f"written {path}")


if __name__ == "__main__":
    main()
