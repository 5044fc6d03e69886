"""The speed page's tables: training steps and batch decoding against the peers, the
decode cells and memory, aiayn against an earlier commit, fused kernels, and the GPU's
training and decoding (bench_train, bench_decode, bench_kernels)."""

from __future__ import annotations

from typing import Any

from benchmarks import report
from benchmarks.report import number, per_round_ratio, ratio, source, table

# Training results, one table each: the small shape (both precisions), then two
# successive runs of the base shape in fp32 (the first saved aside before the second).
TRAIN_FILES = ("train", "train-base-run1", "train-base")


TRAIN_LABELS = {
    "aiayn": "aiayn",
    "hf": "HF MarianMTModel",
    "torch-nn": "torch.nn.Transformer",
    "aiayn-bf16": "aiayn",
    "hf-bf16": "HF MarianMTModel",
    "torch-nn-bf16": "torch.nn.Transformer",
}


def train() -> str:
    """Training steps, fp32 and bf16 autocast, ratios within one precision."""
    parts = []
    for name in TRAIN_FILES:
        if not (report.RESULTS / f"{name}.json").exists():
            continue
        rows = []
        for r in report.load(name)["results"]:
            bf16 = r["system"].endswith("-bf16")
            rows.append(
                [
                    r["size"],
                    ("**{}**" if r["system"] == "aiayn" else "{}").format(
                        TRAIN_LABELS[r["system"]]
                    ),
                    "bf16 autocast" if bf16 else "fp32",
                    f"{r['params'] / 1e6:.2f}M",
                    number(r["tokens_per_s"]),
                    number(r["ms_per_step"]),
                    ratio(r["speedup_vs_hf"]),
                    ratio(r["speedup_vs_torch_nn"]),
                ]
            )
        headers = ["shape", "system", "precision", "params", "tgt tok/s", "ms/step"]
        headers += ["vs HF (same precision)", "vs torch.nn (same precision)"]
        parts += [table(headers, rows, left=3), source(name)]
    return "\n\n".join(parts)


def train_compile() -> str:
    data = report.load("train-compile")
    by = {(r["size"], r["system"]): r for r in data["results"]}
    rows = []
    for size in dict.fromkeys(r["size"] for r in data["results"]):
        eager, compiled = by[size, "aiayn"], by[size, "aiayn-compiled"]
        rows.append(
            [
                size,
                number(eager["tokens_per_s"]),
                number(compiled["tokens_per_s"]),
                ratio(per_round_ratio(eager["times_s"], compiled["times_s"])),
            ]
        )
    headers = ["shape", "eager tgt tok/s", "compiled tgt tok/s", "compiled vs eager"]
    return table(headers, rows, left=1) + "\n\n" + source("train-compile", data)


DECODE_LABELS = {
    "aiayn": "**aiayn**",
    "hf": "HF generate",
    "ct2-fp32": "CTranslate2",
    "ct2-int8": "CTranslate2",
    "aiayn-bf16": "aiayn",
    "hf-bf16": "HF generate",
    "aiayn-steps1": "aiayn, 1-thread steps",
    "aiayn-int8": "aiayn",
    "aiayn-int8-fp32out": "aiayn, fp32 output",
    "aiayn-shortlist": "aiayn + shortlist",
    "aiayn-int8-shortlist": "aiayn + shortlist",
}


PRECISION = {"ct2-int8": "int8", "aiayn-bf16": "bf16", "hf-bf16": "bf16"}


PRECISION.update(
    {"aiayn-int8": "int8", "aiayn-int8-fp32out": "int8", "aiayn-int8-shortlist": "int8"}
)


# The 8-cell table's columns, in this order where the file has them.
CELL_SYSTEMS = (
    "ct2-int8",
    "ct2-fp32",
    "aiayn",
    "aiayn-int8",
    "aiayn-int8-fp32out",
    "aiayn-shortlist",
    "aiayn-int8-shortlist",
)


def first_threads(data: dict[str, Any]) -> str:
    """The first thread count of a decode file's run (`--threads 2,1`: "2")."""
    return str(data.get("args", {}).get("threads", "")).split(",")[0]


def decode_records(data: dict[str, Any], key: str = "results") -> list[dict[str, Any]]:
    """A decode file's records of `key` at its first thread count (all of an older
    file's, whose records do not say their threads)."""
    first = first_threads(data)
    return [r for r in data.get(key, []) if str(r.get("threads", first)) == first]


def decode() -> str:
    """Batch-32 decoding; a ratio between two precisions is marked as such."""
    data = report.load("decode")
    rows = []
    for r in decode_records(data):
        if r["batch"] == 1:
            continue
        system = r["system"]
        precision = PRECISION.get(system, "fp32")
        vs_hf_cross = system == "ct2-int8"  # no HF int8: its "vs HF" is against HF fp32
        vs_ct2_cross = precision != "fp32"
        same = r["same_outputs_as_aiayn"]
        rows.append(
            [
                r["size"],
                r["search"],
                DECODE_LABELS[system],
                precision,
                number(r["tokens_per_s"]),
                number(r["ms_per_call"]),
                ratio(r["speedup_vs_hf"], " †" if vs_hf_cross else ""),
                ratio(r["speedup_vs_ct2_fp32"], " †" if vs_ct2_cross else ""),
                "" if same is None else f"{same}/{r['batch']}",
            ]
        )
    headers = ["shape", "search", "system", "precision", "tgt tok/s", "ms/batch", "vs HF"]
    headers += ["vs CT2 fp32", "same tokens as aiayn*"]
    notes = (
        '"vs HF" is against HF generate of the same precision; † marks a ratio across '
        "precisions (CTranslate2 int8 against HF fp32; bf16 or int8 against CTranslate2 "
        "fp32). *Sentences whose first 29 tokens equal aiayn's at the same precision "
        "(aiayn bf16: aiayn fp32's)."
    )
    if any(r["system"] in ("aiayn-int8", "aiayn-shortlist") for r in data["results"]):
        notes = notes.replace(
            "(aiayn bf16: aiayn fp32's).",
            "(aiayn bf16 and int8: aiayn fp32's; a shortlist row: the same aiayn's without "
            "it; the shortlist is not the random model's, so their tokens differ).",
        )
    return "\n\n".join([table(headers, rows, left=4), notes, source("decode", data)])


def decode_latency() -> str:
    """One sentence (batch 1): ms per call, one column per system."""
    data = report.load("decode")
    systems = [s for s in DECODE_LABELS if any(r["system"] == s for r in data["results"])]
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for r in decode_records(data):
        if r["batch"] == 1:
            cells.setdefault((r["size"], r["search"]), {})[r["system"]] = number(r["ms_per_call"])
    headers = ["shape", "search"] + [
        f"{DECODE_LABELS[s].strip('*')} {PRECISION.get(s, 'fp32')}" for s in systems
    ]
    rows = [
        [size, search] + [row.get(s, "") for s in systems] for (size, search), row in cells.items()
    ]
    return table(headers, rows) + "\n\n" + source("decode", data)


def has_cells(name: str = "decode") -> bool:
    """Whether a decode results file holds the 8-cell summary and memory (issue 17's run)."""
    path = report.RESULTS / f"{name}.json"
    return path.exists() and "cells" in report.load(name)


CELL_LABELS = {
    "ct2-int8": "CT2 int8",
    "ct2-fp32": "CT2 fp32",
    "aiayn": "aiayn fp32",
    "aiayn-int8": "aiayn int8, int8 output",
    "aiayn-int8-fp32out": "aiayn int8, fp32 output",
    "aiayn-shortlist": "aiayn fp32 + shortlist",
    "aiayn-int8-shortlist": "aiayn int8 + shortlist",
    "ct2-int8-vmap": "CT2 int8 + vmap",
    "aiayn-static": "aiayn static step",
    "aiayn-compiled": "aiayn compiled step",
    "aiayn-int8-compiled": "aiayn int8 compiled step",
}


def decode_cells(name: str = "decode") -> str:
    """Issue 17's 8 cells per thread count: tok/s per system, the best aiayn setting (of
    the run's --best-of) against CTranslate2 int8, aiayn fp32 + shortlist against it, and
    aiayn fp32 against CTranslate2 fp32; from results file NAME."""
    data = report.load(name)
    systems = [s for s in CELL_SYSTEMS if any(s in c["tokens_per_s"] for c in data["cells"])]
    vs_int8 = {  # a shortlist row against CTranslate2 with the same candidates where it ran
        (r["threads"], r["size"], r["search"], r["batch"], r["system"]): r.get(
            "speedup_vs_ct2_int8_vmap"
        )
        or r["speedup_vs_ct2_int8"]
        for r in data["results"]
    }
    rows = []
    for c in data["cells"]:
        best = c["best_system"]
        shortlisted = vs_int8.get(
            (c["threads"], c["size"], c["search"], c["batch"], "aiayn-shortlist")
        )
        chosen = c.get("threads_chosen", {})  # threads "best": each system's own count
        rows.append(
            [
                str(c["threads"]),
                c["size"],
                c["search"],
                str(c["batch"]),
                *(
                    number(c["tokens_per_s"][s]) + (f" ({chosen[s]})" if s in chosen else "")
                    if s in c["tokens_per_s"]
                    else ""
                    for s in systems
                ),
                "" if best is None else CELL_LABELS[best],
                f"**{ratio(c['best_vs_ct2_int8'])}**" if c["best_vs_ct2_int8"] else "",
                ratio(shortlisted),
                ratio(c["fp32_vs_ct2_fp32"]),
                "" if c["shortlist_size"] is None else f"{c['shortlist_size']:,}",
            ]
        )
    headers = ["threads", "shape", "search", "batch", *(CELL_LABELS[s] for s in systems)]
    headers += ["best aiayn", "best / CT2 int8", "aiayn fp32 + shortlist / CT2 int8"]
    headers += ["aiayn fp32 / CT2 fp32", "shortlist size"]
    best_of = ", ".join(CELL_LABELS[s] for s in data["best_of"])
    rule = (  # files before the fair race picked the fastest; since, a fixed preference
        "the first that ran, in an order fixed in advance, of"
        if data.get("best_rule") == "preference"
        else "the fastest of"
    )
    setting = data.get("shortlist") or {}
    notes = (
        f"Target tokens/s. Best aiayn: {rule} {best_of} (the run's `--best-of`); "
        "ratios are medians of per-round time ratios (> 1: aiayn is faster). Shortlist "
        "size: the candidates for the cell's sources (out of 8,000), from a synthetic "
        "parallel corpus"
        + (
            f" (frequent {setting['frequent']}, {setting['per_source']} per source piece)"
            if setting
            else ""
        )
        + "."
        + (
            ' Threads "best": each system at the thread count an untimed calibration '
            "chose for it before the timed calls (in brackets), one system's process at a time."
            if any(c["threads"] == "best" for c in data["cells"])
            else ""
        )
    )
    return "\n\n".join([table(headers, rows, left=4), notes, source(name, data)])


def decode_memory(name: str = "decode-fair") -> str:
    """Each system's resident memory (VmHWM) after loading and after decoding, per shape,
    at the run's first thread count; from results file NAME (the fair race: the newest)."""
    data = report.load(name)

    def label(system: str) -> str:
        if system in DECODE_LABELS:
            return f"{DECODE_LABELS[system].strip('*')} {PRECISION.get(system, 'fp32')}"
        return CELL_LABELS.get(system, system)

    rows = [
        [
            m["size"],
            label(m["system"]),
            "" if m["rss_loaded_mb"] is None else f"{m['rss_loaded_mb']:,.0f}",
            "" if m["rss_peak_mb"] is None else f"{m['rss_peak_mb']:,.0f}",
        ]
        for m in decode_records(data, "memory")
    ]
    headers = ["shape", "system", "MiB after loading", "MiB after decoding"]
    notes = (
        "Peak resident memory (VmHWM) of each system's worker process, after loading its "
        "model and after all its calls (both searches, batch 32 and 1). aiayn's and HF's "
        "processes hold torch's libraries; CTranslate2's do not import torch."
    )
    return "\n\n".join([table(headers, rows), notes, source(name, data)])


def decode_vs_commit() -> str:
    """Today's aiayn against commit 2d41774's, two runs: 2 threads and 1 thread."""
    runs = {"2 threads": "decode-vs-2d41774-2threads", "1 thread": "decode-vs-2d41774"}
    records = {label: report.load(name)["results"] for label, name in runs.items()}
    keyed = {
        label: {(r["size"], r["search"], r["batch"]): r for r in rs if r["system"] == "aiayn"}
        for label, rs in records.items()
    }
    baseline = {
        (r["size"], r["search"], r["batch"]): r
        for r in records["2 threads"]
        if r["system"] != "aiayn"
    }
    rows = []
    for size, search, batch in keyed["2 threads"]:
        if batch != 32:
            continue
        now = keyed["2 threads"][size, search, 32]
        then = baseline[size, search, 32]
        rows.append(
            [
                size,
                search,
                f"{number(now['tokens_per_s'])} ({number(then['tokens_per_s'])})",
                ratio(now["speedup_vs_baseline"]),
                ratio(keyed["2 threads"][size, search, 1]["speedup_vs_baseline"]),
                ratio(keyed["1 thread"][size, search, 32]["speedup_vs_baseline"]),
                ratio(keyed["1 thread"][size, search, 1]["speedup_vs_baseline"]),
            ]
        )
    headers = [
        "shape",
        "search",
        "batch 32, 2 threads: tok/s now (2d41774)",
        "ratio",
        "batch 1, 2 threads: ratio",
        "batch 32, 1 thread: ratio",
        "batch 1, 1 thread: ratio",
    ]
    return "\n\n".join([table(headers, rows), *(source(name) for name in runs.values())])


def kernels() -> str:
    data = report.load("kernels")
    rows = [
        [
            r["kernel"],
            r["work"],
            r["aiayn"],
            number(r["aiayn_ms"]),
            r["peer"],
            number(r["peer_ms"]),
            f"**{ratio(r['speedup'])}**",
        ]
        for r in data["results"]
    ]
    headers = ["kernel", "work", "aiayn", "ms", "PyTorch", "ms", "speedup"]
    return table(headers, rows, left=3) + "\n\n" + source("kernels", data)


def gpu_train(name: str = "train-gpu-big") -> str:
    """bench_train --device cuda: one shape's bf16 training step per system, with MFU."""
    data = report.load(name)
    rows = [
        [
            TRAIN_LABELS.get(r["system"], r["system"]),
            number(r["tokens_per_s"]),
            number(r["ms_per_step"]),
            number(r["model_tflops"]),
            "—" if r["mfu"] is None else f"**{100 * r['mfu']:.1f}%**",
            ratio(r["speedup_vs_hf"]),
            ratio(r["speedup_vs_torch_nn"]),
        ]
        for r in data["results"]
    ]
    headers = ["system", "tgt tok/s", "ms/step", "TFLOP/s", "MFU", "vs HF", "vs torch.nn"]
    first = data["results"][0]
    said = (
        f"The {first['size']} shape, about {first['params'] / 1e6:.0f}M parameters; every "
        "system in bf16 autocast."
    )
    return "\n\n".join([said, table(headers, rows, left=1), source(name, data)])


def gpu_decode(name: str = "decode-gpu-b256") -> str:
    """bench_decode --device cuda: target tokens/s per search and system, against HF."""
    data = report.load(name)
    rows = [
        [
            r["size"],
            r["search"],
            str(r["batch"]),
            DECODE_LABELS.get(r["system"], r["system"])
            + (", bf16" if "bf16" in r["system"] else ""),
            number(r["tokens_per_s"]),
            number(r["ms_per_call"]),
            ratio(r["speedup_vs_hf"]),
        ]
        for r in data["results"]
    ]
    headers = ["shape", "search", "batch", "system", "tgt tok/s", "ms/call", "vs HF"]
    return table(headers, rows) + "\n\n" + source(name, data)
