"""Where `aiayn translate`'s decoding time goes: fixed batches against the continuous engine.

    OMP_NUM_THREADS=1 python -m benchmarks.profile_translate --run RUN [--sentences 64]
        [--systems batches,continuous-32] [--beam 8] [--alpha 1.0] [--top 15]

The first `--sentences` verses of RUN's corpus test split (as `bench_translate` finds
them), encoded once, are translated by each system as `aiayn translate` decodes them
(`Translator.translate_ids`: sorted batches of 4096 source tokens; `stream_ids`: the
continuous-batching engine with N sentences at once). Each system runs once to warm
up, then once under cProfile. Printed per system: the `--top` functions by cumulative
and by own time, as shares of the profiled total (cProfile's own cost included: shares,
not timings), and the shares of its main parts (the model's step, the beam search's
bookkeeping, admission). Nothing is written.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from pathlib import Path

from benchmarks import common

# (part, the functions whose cumulative time it is: file name ends, function name)
PARTS = {
    "batches": [
        ("model step (decoder + projection)", "inference/decoding.py", "step"),
        ("encoder", "inference/decoding.py", "start"),
        ("cache reorder", "inference/kv_cache.py", "reorder"),
    ],
    "continuous": [
        ("model step (StaticStep.log_probs)", "inference/static_step.py", "log_probs"),
        ("admission (encoder, slots' source)", "inference/engine.py", "_admit"),
        ("beam bookkeeping (Engine._beam)", "inference/engine.py", "_beam"),
        ("  of which the slots' reorder", "inference/static_step.py", "copy_ranges"),
        ("token rules (apply_rules)", "inference/scoring.py", "apply_rules"),
    ],
}


def profiled(run, rows, config) -> pstats.Stats:
    """cProfile's statistics of one call of `run(rows, config)`, after one to warm up."""
    run(rows, config)
    profile = cProfile.Profile()
    profile.enable()
    run(rows, config)
    profile.disable()
    return pstats.Stats(profile)


def report(name: str, stats: pstats.Stats, top: int) -> None:
    """Print the top functions by cumulative and own time, and the parts, as shares."""
    total = stats.total_tt
    print(f"\n== {name}: {total:.2f} s profiled (cProfile's cost included)")
    for key, label in (("cumulative", "cumulative"), ("tottime", "own")):
        print(f"-- top {top} by {label} time: own %, cumulative %, calls, function")
        stats.sort_stats(key)
        for func in stats.fcn_list[:top]:
            _, calls, own, cumulative, _ = stats.stats[func]
            where = f"{Path(func[0]).name}:{func[1]}" if func[1] else "~"
            print(f"{100 * own / total:6.1f} {100 * cumulative / total:6.1f} {calls:7d}  "
                  f"{where}({func[2]})")  # fmt: skip
    kind = "batches" if name == "batches" else "continuous"
    print("-- parts (cumulative %)")
    for part, file, function in PARTS[kind]:
        share = sum(
            stat[3]
            for func, stat in stats.stats.items()
            if func[0].endswith(file) and func[2] == function
        )
        print(f"{100 * share / total:6.1f}  {part}")


def main() -> None:
    from aiayn.apps.translate import Translator
    from aiayn.data.files import read_lines

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--systems", default="batches,continuous-32")
    parser.add_argument("--beam", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    source, _ = common.test_files(args.run)
    translator = Translator.load(args.run)
    config = translator.decode_config(beam=args.beam, alpha=args.alpha)
    rows = translator.encode(read_lines(source)[: args.sentences])
    for system in args.systems.split(","):
        if system == "batches":
            stats = profiled(translator.translate_ids, rows, config)
        else:
            kind, _, slots = system.rpartition("-")
            if kind != "continuous" or not slots.isdigit():
                parser.error(f"unknown system {system!r}: batches or continuous-N")
            stats = profiled(
                lambda r, c, n=int(slots): translator.stream_ids(r, c, n), rows, config
            )
        report(system, stats, args.top)


if __name__ == "__main__":
    main()
