"""Decoding speed on CPU: aiayn vs Hugging Face `generate` vs CTranslate2, same weights.

    python -m benchmarks.bench_decode [--quick]

One random-weight MarianMTModel per shape is saved with `save_pretrained` into a
work directory, loaded into aiayn (`load_marian_model`) and Hugging Face, and
converted to CTranslate2 fp32 and int8 with its `TransformersConverter`. Every
system decodes the same 32 sources of 30 tokens and runs exactly 30 decoder steps
per sentence (eos is forbidden until the last step), greedy and beam 4. Metric:
target tokens/s = batch x 30 / wall time of one call, the encoder included. The race
is `decode_race`'s: one system's process at a time, each system's thread count per
cell chosen by an untimed calibration, then timed passes; the tables show each thread
count ("same threads") and each system at its chosen count ("best"), medians and the
median of the ratios of calls of the same pass and round. Batch-1 rows give the
latency of one sentence. "aiayn, 1-thread steps" runs the encoder with the same threads
and each decoding step with one (`aiayn.inference.threads.StepThreads`). The systems
and their worker processes are in `decode_systems`; this module is the parent.

The default run is issue 17's 8 cells (small/base x greedy/beam 4 x batch 32/1) for
aiayn fp32, aiayn int8 (`freeze(model, torch.int8)`), each with and without an output
shortlist, CTranslate2 fp32 and int8, and HF. `--threads 2,1` measures each thread
count in turn (worker processes of their own). Random weights have no translation
table, so the shortlist (`aiayn.inference.shortlist`) is built from a synthetic parallel corpus
(`common.synthetic_parallel`) whose candidate sets have the size they have on text;
its set size per cell is reported. Per cell: "best / CT2 int8", the fastest of the
`--best-of` systems (those keeping the quality goal) against CTranslate2 int8 (a
shortlist against CTranslate2 int8 with the same candidates as its vocabulary map), and
"aiayn fp32 / CT2 fp32". Memory: each worker's resident-set high-water mark (VmHWM)
after loading its model and after all its calls. CTranslate2's workers do not import
torch, so their memory is CTranslate2's own. Outputs of the shortlist rows cannot
match aiayn's on random weights (the shortlist is not the model's); their quality is
measured on a trained model (docs/explanation/results/cpu-inference.md).

    python -m benchmarks.bench_decode --threads 2,1

On CPUs that multiply bfloat16 natively (AMX or AVX512-BF16) aiayn and Hugging
Face also run with their weights cast to bfloat16 ("-bf16" systems; CTranslate2
has no bfloat16 on the CPU); their "vs HF" ratio is against HF in bfloat16.

`--against COMMIT` also runs aiayn as of that commit (its own script and library,
from a git worktree in the work directory) and adds a "vs COMMIT" column: the
median per-round ratio of its time to today's, so > 1 means faster now.

    python -m benchmarks.bench_decode --systems aiayn --against 2d41774

`--device cuda` runs aiayn, HF and CTranslate2 on a GPU (bf16 rows where the card
supports bf16); the rest is the same. The issue's GPU comparison, beam 4:

    python -m benchmarks.bench_decode --device cuda --beams 4 \
        --systems aiayn,hf,ct2-fp32,aiayn-bf16,hf-bf16
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from benchmarks import common, decode_race  # torch is imported where used (see decode_systems)
from benchmarks.decode_systems import (
    BEST_OF,
    BF16_SYSTEMS,
    DEFAULT_SYSTEMS,
    LABELS,
    SHORTLIST_FILE,
    SHORTLIST_SYSTEMS,
    SYSTEMS,
    VMAP_FILE,
    VMAP_SYSTEMS,
    worker,
)

# ----- parent --------------------------------------------------------------------------


def prepare_shortlist(workdir: Path, frequent: int | None, per_source: int | None) -> dict:
    """The shortlist of the synthetic parallel corpus, built once per workdir and setting.

    Returns:
        The setting built with: frequent and per_source (`aiayn.inference.shortlist`'s defaults
        where None).
    """
    from aiayn.inference import shortlist

    setting = {
        "frequent": shortlist.DEFAULT_FREQUENT if frequent is None else frequent,
        "per_source": shortlist.DEFAULT_PER_SOURCE if per_source is None else per_source,
    }
    path, recorded = workdir / SHORTLIST_FILE, workdir / "shortlist-setting.json"
    if not path.exists() or not recorded.exists() or json.loads(recorded.read_text()) != setting:
        sources, targets = common.synthetic_parallel()
        built = shortlist.build(
            sources, targets, common.VOCAB, common.EOS, exclude=[common.PAD], **setting
        )
        built.save(path)
        recorded.write_text(json.dumps(setting))
    return setting


def prepare(workdir: Path, size: str, systems: list[str]) -> None:
    marian = workdir / f"marian-{size}"
    if not (marian / "config.json").exists():
        common.save_random_marian(size, marian)
    for quantization in ("fp32", "int8"):
        out = workdir / f"ct2-{size}-{quantization}"
        wanted = {f"ct2-{quantization}", f"ct2-{quantization}-vmap"} & set(systems)
        if wanted and not (out / "model.bin").exists():
            common.convert_ct2(marian, out, None if quantization == "fp32" else "int8")
        if f"ct2-{quantization}-vmap" in systems:
            with_vmap = workdir / f"ct2-{size}-{quantization}-vmap"
            shutil.copytree(out, with_vmap, dirs_exist_ok=True)
            write_vmap(workdir / SHORTLIST_FILE, with_vmap / VMAP_FILE)


def write_vmap(shortlist_path: Path, out: Path) -> None:
    """aiayn's shortlist as CTranslate2's vocabulary map: a line "<TAB>frequent pieces"
    (always candidates) and one "source<TAB>its translations" per source piece, in the
    benchmark's synthetic token names (`common.ct2_token`)."""
    from aiayn.inference.shortlist import Shortlist

    shortlist = Shortlist.load(shortlist_path, common.VOCAB)
    names = [common.ct2_token(i) for i in range(common.VOCAB)]
    lines = ["\t" + " ".join(names[i] for i in shortlist.frequent.tolist())]
    for source, row in enumerate(shortlist.table.tolist()):
        targets = [names[i] for i in row if i >= 0]
        if targets:
            lines.append(f"{names[source]}\t{' '.join(targets)}")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def agreement(a: list[list[int]], b: list[list[int]], n: int) -> int:
    """Sentences whose first n tokens agree (aiayn's last token is the forced eos)."""
    return sum(x[:n] == y[:n] for x, y in zip(a, b, strict=True))


def same_as(system: str) -> str | None:
    """The system whose outputs `system`'s are compared with: aiayn of the same precision
    (aiayn bf16 and int8: aiayn fp32), or the same aiayn without the shortlist."""
    if system in ("aiayn", "aiayn-steps1"):
        return None
    if system in SHORTLIST_SYSTEMS:
        return system.removesuffix("-shortlist")
    return "aiayn-bf16" if system == "hf-bf16" else "aiayn"


def per_round(times: dict[str, list[float]], slower: str, faster: str | None) -> float | None:
    """The median over rounds of times[slower] / times[faster] (> 1: `faster` is faster);
    None when either system was not run."""
    if faster not in times or slower not in times:
        return None
    return common.median([a / b for a, b in zip(times[slower], times[faster], strict=True)])


def cell_summary(times: dict[str, list[float]], best_of: list[str]) -> dict:
    """One cell's comparison with CTranslate2, from each system's per-round seconds.

    Args:
        times: system -> seconds of its timed calls, round by round, in this cell.
        best_of: the aiayn systems that keep the quality goal, in an order of
            preference fixed in advance (from bench_quality.py, not from these times):
            the first of them that ran is "best", whatever its speed.

    Returns:
        best_system (None if none of `best_of` ran), best_vs_ct2_int8 (median per-round
        ratio of CTranslate2 int8's time to best's; for a shortlist system, of
        CTranslate2 int8 with the same candidates as its vocabulary map) and
        fp32_vs_ct2_fp32 (CTranslate2 fp32's to aiayn fp32's); a ratio is None where a
        system of it did not run.
    """
    best = next((s for s in best_of if s in times), None)
    peer = "ct2-int8-vmap" if best in SHORTLIST_SYSTEMS else "ct2-int8"
    return {
        "best_system": best,
        "best_vs_ct2_int8": per_round(times, peer, best),
        "fp32_vs_ct2_fp32": per_round(times, "ct2-fp32", "aiayn"),
    }


def measure(
    args: argparse.Namespace,
    systems: list[str],
    thread_counts: list[int],
    size: str,
    configs: list[tuple[int, int]],
    workdir: Path,
    baseline: str | None,
    checkout: Path | None,
) -> decode_race.Race:
    """One size: every system calibrated, then raced, one worker process at a time
    (`decode_race`), at every thread count of `thread_counts`."""
    module = __spec__.name  # benchmarks.bench_decode, run with -m from a repository's root

    def start(system: str, threads: int) -> common.Worker:
        worker_args = [
            *("--workdir", str(workdir), "--size", size),
            *("--threads", str(threads), "--device", args.device),
        ]
        if system == baseline:  # the commit's own script and library, as its system "aiayn"
            return common.Worker(
                module, "aiayn", worker_args, threads, str(checkout / "src"), root=checkout
            )
        own_args = [*worker_args, "--int8-shortlist-output", args.int8_shortlist_output]
        return common.Worker(module, system, own_args, threads)

    def request(cell: tuple[int, int]) -> dict:
        beam, batch = cell
        return dict(beam=beam, batch=batch, src_len=args.src_len, tgt_len=args.tgt_len)

    return decode_race.run_race(
        start,
        systems,
        thread_counts,
        configs,
        request,
        args.rounds,
        args.passes,
        args.calibration_calls,
    )


def summarise_cell(
    args: argparse.Namespace,
    race: decode_race.Race,
    systems: list[str],
    size: str,
    cell: tuple[int, int],
    threads: int | None,
    best_of: list[str],
    baseline: str | None,
) -> tuple[dict, list[dict]]:
    """One cell's summary and its systems' records, at `threads` for every system ("same
    threads"), or with `threads` None at each system's thread count chosen by the
    calibration ("each at its best").

    Returns:
        (cell: the summary, tok/s per system and, at best, the threads chosen; the
        records, one per system: tok/s, ms per call, its times and ratios to the peers).
    """
    beam, batch = cell
    search = "greedy" if beam == 1 else f"beam {beam}"
    n_tokens = batch * args.tgt_len
    if threads is None:
        times = {s: race.at_best(s, cell) for s in systems}
    else:
        times = {s: race.times[s, threads, cell] for s in systems}
    where = dict(threads="best" if threads is None else threads, size=size, search=search)
    summary = dict(
        **where,
        batch=batch,
        **cell_summary(times, best_of),
        shortlist_size=race.shortlist_sizes.get(cell),
        tokens_per_s={s: n_tokens / common.median(times[s]) for s in systems},
    )
    if threads is None:
        summary["threads_chosen"] = {s: race.best_threads[s, cell] for s in systems}
    records = []
    for s in systems:
        seconds = common.median(times[s])
        bf16 = s in BF16_SYSTEMS
        # HF of the same precision; CTranslate2 in fp32 (it has no CPU bf16); a shortlist
        # only against CTranslate2 given the same candidates (its vocabulary map).
        listed = s in SHORTLIST_SYSTEMS
        vs = {
            "hf": per_round(times, "hf-bf16" if bf16 else "hf", s),
            "ct2-fp32": None if listed else per_round(times, "ct2-fp32", s),
            "ct2-int8": None if listed else per_round(times, "ct2-int8", s),
            "ct2-int8-vmap": per_round(times, "ct2-int8-vmap", s) if listed else None,
            "baseline": per_round(times, baseline, s) if baseline and s == "aiayn" else None,
        }
        reference = same_as(s)
        same = None
        if reference in systems:
            same = agreement(race.outputs[reference, cell], race.outputs[s, cell], args.tgt_len - 1)
        records.append(
            dict(
                **where,
                batch=batch,
                system=s,
                tokens_per_s=n_tokens / seconds,
                ms_per_call=1000 * seconds,
                times_s=times[s],
                speedup_vs_hf=vs["hf"],
                speedup_vs_ct2_fp32=vs["ct2-fp32"],
                speedup_vs_ct2_int8=vs["ct2-int8"],
                speedup_vs_ct2_int8_vmap=vs["ct2-int8-vmap"],
                speedup_vs_baseline=vs["baseline"],
                same_outputs_as_aiayn=same,
                same_outputs_as=reference if same is not None else None,
            )
        )
    return summary, records


def _mb(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def decode_measures(
    args: argparse.Namespace, systems: list[str], thread_counts: list[int]
) -> list[dict[str, str]]:
    """What a results file of this run measures (`benchmarks.report.measures`): the
    systems' decoding and their workers' memory, in the cells the arguments give."""
    sizes = " and ".join(args.sizes.split(","))
    searches = " and ".join("greedy" if b == "1" else f"beam {b}" for b in args.beams.split(","))
    batches = f"batch {args.batch}" + ("" if args.no_latency else " and 1")
    threads = " and ".join(map(str, sorted(thread_counts)))
    threads += " thread" if thread_counts == [1] else " threads"
    cell = f"random Marian {sizes}, {searches}, {batches}, {threads}, "
    harness = (
        "bench_decode's race: one system's process at a time, each system's threads per "
        "cell chosen by an untimed calibration, no OpenMP wait policy forced"
    )
    return [
        {
            "system": ", ".join(LABELS[s] for s in systems) + ": decoding",
            "cell": cell + common.device_name(args.device),
            "harness": harness,
        },
        {
            "system": "each decoding worker's resident memory",
            "cell": f"random Marian {sizes}, {common.device_name(args.device)}",
            "harness": f"{harness}; VmHWM after loading and after decoding",
        },
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,base")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=f"of {SYSTEMS}")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--src-len", type=int, default=30)
    parser.add_argument("--tgt-len", type=int, default=30)
    parser.add_argument(
        "--threads", default="1,2", help="thread counts, measured in turn; default 1,2"
    )
    parser.add_argument(
        "--best-of",
        default=BEST_OF,
        help="the aiayn systems that keep the quality goal (bench_quality.py), in order of "
        "preference: the first that runs is 'best' (fixed in advance, not the fastest)",
    )
    parser.add_argument(
        "--shortlist-frequent", type=int, metavar="N", help="default: aiayn.inference.shortlist's"
    )
    parser.add_argument(
        "--shortlist-per-source", type=int, metavar="K", help="default: aiayn.inference.shortlist's"
    )
    parser.add_argument(
        "--int8-shortlist-output",
        choices=("fp32", "int8"),
        default="fp32",
        help="aiayn-int8-shortlist's output projection: fp32 rows gathered for the "
        "candidates (default), or int8 over the vocabulary, masked",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--rounds", type=int, default=3, help="timed calls per cell in each timed process"
    )
    parser.add_argument(
        "--passes", type=int, default=2, help="timed processes per system and thread count"
    )
    parser.add_argument(
        "--calibration-calls",
        type=int,
        default=2,
        help="untimed calls per cell that choose each system's thread count",
    )
    parser.add_argument("--no-latency", action="store_true", help="skip the batch-1 rows")
    parser.add_argument(
        "--quick", action="store_true", help="1 pass of 2 rounds, 1 calibration call, fp32 peers"
    )
    parser.add_argument("--workdir", type=Path, help="keep the models here (default: temp)")
    parser.add_argument(
        "--against",
        metavar="COMMIT",
        help="also run aiayn as of COMMIT (a git worktree in the workdir), for a 'vs COMMIT' ratio",
    )
    parser.add_argument("--results", help="results file name (default: decode[-vs-COMMIT])")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(
            args.worker,
            args.workdir,
            args.size,
            int(args.threads),
            args.device,
            args.int8_shortlist_output,
        )
    if args.tgt_len < args.src_len:
        parser.error("--tgt-len must be >= --src-len (aiayn's limit is source + extra_len)")
    try:
        thread_counts = [int(t) for t in args.threads.split(",")]
    except ValueError:
        parser.error(f"--threads {args.threads!r}: give thread counts such as 2 or 2,1")
    if min(thread_counts) < 1:
        parser.error(f"--threads {args.threads!r}: thread counts are 1 or more")
    systems = args.systems.split(",")
    unknown = [s for s in systems + args.best_of.split(",") if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}; known: {', '.join(SYSTEMS)}")
    best_of = args.best_of.split(",")
    if args.quick:  # fp32 peers only
        args.rounds, args.passes, args.calibration_calls = 2, 1, 1
        systems = [
            s for s in systems if s not in ("ct2-int8", "ct2-int8-vmap") and s not in BF16_SYSTEMS
        ]
    if min(args.rounds, args.passes, args.calibration_calls) < 1:
        parser.error("--rounds, --passes and --calibration-calls are 1 or more")
    systems = common.without_unsupported_bf16(systems, BF16_SYSTEMS, args.device)
    workdir = args.workdir or common.default_workdir()
    workdir.mkdir(parents=True, exist_ok=True)
    baseline = checkout = None
    if args.against:
        baseline = f"aiayn@{args.against}"
        LABELS[baseline] = f"aiayn {args.against}"
        systems.append(baseline)
        checkout = common.baseline_checkout(workdir, args.against)
    shortlist_setting = None
    if set(systems) & {*SHORTLIST_SYSTEMS, *VMAP_SYSTEMS}:
        shortlist_setting = prepare_shortlist(
            workdir, args.shortlist_frequent, args.shortlist_per_source
        )
    configs = [(beam, args.batch) for beam in map(int, args.beams.split(","))]
    if not args.no_latency:
        configs += [(beam, 1) for beam in map(int, args.beams.split(","))]

    rows, records, cells, cell_rows, memory_records, load_records = [], [], [], [], [], []
    for size in args.sizes.split(","):
        prepare(workdir, size, systems)
        race = measure(args, systems, thread_counts, size, configs, workdir, baseline, checkout)
        load_records += [dict(size=size, **record) for record in race.load]
        for (s, threads), memory in race.memory.items():
            rss = {f"rss_{k}_mb": v for k, v in memory.items()}
            memory_records.append(dict(threads=threads, size=size, system=s, **rss))
        for threads in [*thread_counts, None]:  # None: each system at its best
            for cell in configs:
                summary, cell_records = summarise_cell(
                    args, race, systems, size, cell, threads, best_of, baseline
                )
                cells.append(summary)
                records += cell_records
                rows += [
                    [
                        *(r[k] for k in ("threads", "size", "search", "batch")),
                        LABELS[r["system"]],
                        r["tokens_per_s"],
                        r["ms_per_call"],
                        _ratio(r["speedup_vs_hf"]),
                        _ratio(r["speedup_vs_ct2_fp32"]),
                        _ratio(r["speedup_vs_ct2_int8"] or r["speedup_vs_ct2_int8_vmap"]),
                        "" if r["same_outputs_as_aiayn"] is None
                        else f"{r['same_outputs_as_aiayn']}/{r['batch']}",
                        *([] if not baseline else [_ratio(r["speedup_vs_baseline"])]),
                    ]
                    for r in cell_records
                ]  # fmt: skip
                chosen = summary.get("threads_chosen", {})
                cell_rows.append(
                    [
                        *(summary[k] for k in ("threads", "size", "search", "batch")),
                        *(
                            f"{summary['tokens_per_s'][s]:,.0f}"
                            + (f" ({chosen[s]})" if s in chosen else "")
                            for s in systems
                        ),
                        LABELS.get(summary["best_system"], ""),
                        _ratio(summary["best_vs_ct2_int8"]),
                        _ratio(summary["fp32_vs_ct2_fp32"]),
                        "" if summary["shortlist_size"] is None else summary["shortlist_size"],
                    ]
                )

    print(
        f"\nDecoding, {args.src_len} source tokens -> exactly {args.tgt_len} target tokens, "
        f"{args.threads} threads and each system at its best (threads chosen by the "
        f"calibration, in brackets), median of {args.passes} x {args.rounds} calls, one "
        f"system at a time; {common.device_name(args.device)}\n"
    )
    print(
        common.table(
            [
                "threads",
                "shape",
                "search",
                "batch",
                "system",
                "tgt tok/s",
                "ms/call",
                "vs HF",
                "vs CT2 fp32",
                "vs CT2 int8",
                "same output*",
                *([] if not baseline else [f"vs {args.against}"]),
            ],
            rows,
        )
    )
    print(
        "\n*sentences whose tokens equal those of aiayn at the same precision (aiayn bf16 "
        "and int8: aiayn fp32's; a shortlist row: the same aiayn without it); bf16 rows' "
        '"vs HF" is against HF bf16.'
    )
    print(f"\nThe cells: tgt tok/s; best of {args.best_of}\n")
    print(
        common.table(
            [
                "threads",
                "shape",
                "search",
                "batch",
                *(LABELS[s] for s in systems),
                "best",
                "best / CT2 int8",
                "aiayn fp32 / CT2 fp32",
                "shortlist size",
            ],
            cell_rows,
        )
    )
    print("\nResident memory, MiB: VmHWM after loading / after decoding\n")
    print(
        common.table(
            ["threads", "shape", "system", "after loading", "after decoding"],
            [
                [
                    m["threads"],
                    m["size"],
                    LABELS[m["system"]],
                    _mb(m.get("rss_loaded_mb")),
                    _mb(m.get("rss_peak_mb")),
                ]
                for m in memory_records
            ],
        )
    )
    path = common.write_json(
        args.results or (f"decode-vs-{args.against}" if args.against else "decode"),
        {
            "measures": decode_measures(args, systems, thread_counts),
            "args": {k: str(v) for k, v in vars(args).items()},
            "method": (
                f"{len(systems)} systems, each in worker processes of its own, one process "
                "alive at a time (benchmarks/decode_race.py): no system's threads run or "
                "spin while another's are timed, and no OpenMP wait policy is forced on any. "
                f"First an untimed calibration ({args.calibration_calls} calls per cell after "
                "a warm-up, each system at each thread count) fixes each system's best "
                f"thread count per cell; then {args.passes} passes (the system order reversed "
                "on every other pass), each a fresh process per system and thread count: one "
                f"warm-up call per cell (a compiled step compiles there), {args.rounds} "
                "timed rounds of one call per cell. Rows with threads 'best' take each "
                "system's timed calls at the thread count its calibration chose. Ratios are "
                "medians of the ratios of calls of the same pass and round. A shortlist is "
                "compared only with CTranslate2 given the same candidates (its vocabulary "
                "map). Memory: each worker's VmHWM (/proc/PID/status) after loading its "
                "model and after its last call. The shortlist is built from a synthetic "
                "parallel corpus (common.synthetic_parallel)."
            ),
            "settings": {
                "environment": decode_race.stated_settings(),
                "threads": "OMP_NUM_THREADS and MKL_NUM_THREADS per worker; torch.set_num_threads "
                "for aiayn and HF, intra_threads (inter_threads 1) for CTranslate2",
            },
            "load_per_process": load_records,
            "best_of": best_of,
            "best_rule": "preference",  # the first of best_of that ran, fixed in advance
            "shortlist": shortlist_setting,
            "results": records,
            "cells": cells,
            "memory": memory_records,
        },
    )
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
