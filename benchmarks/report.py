"""The docs' measured tables, rendered from the committed results files.

    python -m benchmarks.report            # print every table
    python -m benchmarks.report --write    # put them into README.md and docs/**/*.md
    python -m benchmarks.report --check    # exit 1 naming each table that is stale

Every table in README.md or a docs page (`docs/**/*.md`) that holds measured figures
sits between two markers (a table may appear in several of them),

    <!-- report:NAME -->
    ...
    <!-- /report:NAME -->

and is rendered here from `benchmarks/results/*.json` (each written by the script that
measured it), with a line naming the file, its date, machine, CPU features, torch
version, threads, load average, commit and command, and what the file does not record;
under it, a mark where the run was measured under load (`load_mark`).
`tests/docs/test_readme_figures.py` runs the check, so a figure edited by hand, or a
results file re-measured without `--write`, fails the suite.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BLOCK = re.compile(r"<!-- report:([a-z0-9-]+) -->\n(.*?)<!-- /report:\1 -->", re.DOTALL)
# The CPU features a figure can depend on: bf16 rows need AMX or AVX512-BF16 to win.
KEY_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
# Files written before the provenance record name the machine but not its flags.
DESCRIBED_FEATURES = {
    "Intel(R) Xeon(R) Processor, 2 cores": "CPU features not in the file; README described "
    "this machine when it was measured as AVX-512, AVX-512-VNNI and AMX"
}


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


# ----- formatting ----------------------------------------------------------------------


def number(value: float) -> str:
    """1,234 / 123 / 12.3 / 1.23: three significant figures at most, thousands grouped."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ratio(value: float | None, mark: str = "") -> str:
    return "" if value is None else f"{value:.2f}x{mark}"


def table(headers: list[str], rows: list[list[str]], left: int = 2) -> str:
    lines = ["| " + " | ".join(headers) + " |"]
    lines.append("|" + "|".join("---" if i < left else "---:" for i in range(len(headers))) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def per_round_ratio(slower: list[float], faster: list[float]) -> float:
    """The median over rounds of slower / faster (> 1: `faster` is faster)."""
    return statistics.median(a / b for a, b in zip(slower, faster, strict=True))


def recorded_commit(data: dict[str, Any]) -> str | None:
    """The commit a results file names (bench_positions keeps it under "library")."""
    return data.get("commit") or data.get("library", {}).get("commit")


def load_mark(data: dict[str, Any], needs_quiet: bool = False) -> str | None:
    """The mark of figures measured under load, or None.

    A results file's `load` record (benchmarks/common.py, `load_record`) says whether other
    work beside the run kept the load average above 0.75 per core; such a file is marked
    wherever it is shown. A table of absolute latencies or throughputs measured one system at a time
    (`needs_quiet`: serve, generate) is marked also when its file records no quiet load.
    """
    load = data.get("load")
    if load and load.get("noisy"):
        return (
            f"**Measured under load:** load average {load['before'][0]:g} before and "
            f"{load['after'][0]:g} after the timed part ({load['threads'] or 0} thread(s) of "
            f"its own), above {load['limit']:g} for {load['cores']} cores; the figures may be "
            "lower than on a quiet machine."
        )
    if needs_quiet and not (load and load.get("noisy") is False):
        end = data.get("load_average")
        at_end = f" ({end[0]:g} at its end, its own threads included)" if end else ""
        return (
            f"**Load not recorded** before the timed part{at_end}: these figures are not "
            "known to come from a quiet machine."
        )
    return None


def source(
    name: str,
    data: dict[str, Any] | None = None,
    record: str | None = None,
    needs_quiet: bool = False,
    timed: bool = True,
) -> str:
    """One line: where a table's figures come from, and what that file does not record;
    then, on a line of its own, `load_mark`'s mark where there is one.

    `record`: the key of the file's sub-record the table comes from, if not the whole file.
    `needs_quiet`: the table's figures need a quiet machine (see `load_mark`).
    `timed`: False for a table of scores (BLEU), which the load cannot move: no mark.
    """
    data = load(name) if data is None else data
    said = [f"`benchmarks/results/{name}.json`" + (f" record `{record}`" if record else "")]
    missing = []
    said.append(data.get("date", "no date"))
    said.append(f'"{data["machine"]}"' if "machine" in data else "machine not recorded")
    if "gpu" in data:
        said.append(data["gpu"])
    if "cpu_flags" in data:
        flags = [f for f in KEY_FLAGS if f in data["cpu_flags"]]
        absent = [f for f in ("avx512f", "avx512_bf16", "amx_tile") if f not in data["cpu_flags"]]
        said.append(
            "CPU features "
            + (", ".join(flags) or "none of " + ", ".join(KEY_FLAGS))
            + (f" (no {', no '.join(absent)})" if absent else "")
        )
    elif data.get("machine") in DESCRIBED_FEATURES:
        said.append(DESCRIBED_FEATURES[data["machine"]])
    else:
        missing.append("CPU flags")
    torch_version = data.get("versions", {}).get("torch")
    said.append(f"torch {torch_version}" if torch_version else "torch version not recorded")
    threads = data.get("args", {}).get("threads", data.get("threads"))
    if threads is not None:
        said.append(f"{threads} thread{'s' if str(threads) != '1' else ''}")
    run_load, load_average = data.get("load"), data.get("load_average")
    if run_load and run_load.get("before") and run_load.get("after"):
        said.append(
            f"load average {run_load['before'][0]:g} before and {run_load['after'][0]:g} "
            "after its timed part"
        )
    elif load_average:
        said.append(f"load average {load_average[0]:g} at its end")
    commit = recorded_commit(data)
    if commit:
        said.append(f"commit `{commit}`")
    else:
        missing.append("commit")
    if data.get("command"):
        said.append(f"`{data['command']}`")
    else:
        missing.append("command")
    line = "Source: " + "; ".join(said) + "."
    if missing:
        line += (
            " This file predates the provenance record and does not say its "
            + ", ".join(missing)
            + "."
        )
    mark = load_mark(data, needs_quiet) if timed else None
    return line if mark is None else f"{line}\n\n{mark}"


# ----- tables --------------------------------------------------------------------------

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
        if not (RESULTS / f"{name}.json").exists():
            continue
        rows = []
        for r in load(name)["results"]:
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
    data = load("train-compile")
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
    data = load("decode")
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
    data = load("decode")
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
    path = RESULTS / f"{name}.json"
    return path.exists() and "cells" in load(name)


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
    data = load(name)
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
        rows.append(
            [
                str(c["threads"]),
                c["size"],
                c["search"],
                str(c["batch"]),
                *(number(c["tokens_per_s"][s]) if s in c["tokens_per_s"] else "" for s in systems),
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
    )
    return "\n\n".join([table(headers, rows, left=4), notes, source(name, data)])


def decode_memory() -> str:
    """Each system's resident memory (VmHWM) after loading and after decoding, per shape."""
    data = load("decode")
    rows = [
        [
            m["size"],
            f"{DECODE_LABELS[m['system']].strip('*')} {PRECISION.get(m['system'], 'fp32')}",
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
    return "\n\n".join([table(headers, rows), notes, source("decode", data)])


def decode_vs_commit() -> str:
    """Today's aiayn against commit 2d41774's, two runs: 2 threads and 1 thread."""
    runs = {"2 threads": "decode-vs-2d41774-2threads", "1 thread": "decode-vs-2d41774"}
    records = {label: load(name)["results"] for label, name in runs.items()}
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
    data = load("kernels")
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


def attention(name: str = "attention") -> str:
    data = load(name)
    rows = []
    for r in data["results"]:
        skipped = "explicit_ms" not in r or r["explicit_ms"] is None
        rows.append(
            [
                f"{r['length']:,}",
                number(r["sdpa_ms"]),
                number(r["sdpa_peak_mib"]),
                "skipped" if skipped else number(r["explicit_ms"]),
                "skipped" if skipped else number(r["explicit_peak_mib"]),
            ]
        )
    headers = ["length", "SDPA ms", "SDPA peak MiB", "explicit ms", "explicit peak MiB"]
    return table(headers, rows, left=1) + "\n\n" + source(name, data)


def sliding_window(name: str = "attention") -> str:
    data = load(name)["sliding_window"]
    rows, notes = [], []
    for r in data["results"]:
        skipped = r.get("skipped", {})

        def cell(kind: str, field: str, r=r) -> str:
            value = r.get(f"{kind}_{field}")
            return "skipped" if value is None else number(value)

        notes += [f"{r['length']:,}, {kind}: {why}" for kind, why in skipped.items()]

        rows.append(
            [
                f"{r['length']:,}",
                number(r["sliding_ms"]),
                number(r["sliding_train_ms"]),
                number(r["sliding_peak_mib"]),
                cell("band", "ms"),
                cell("band", "peak_mib"),
                cell("full", "ms"),
                cell("full", "peak_mib"),
            ]
        )
    headers = ["length", "sliding ms", "sliding fwd+bwd ms", "sliding peak MiB"]
    headers += ["band-mask SDPA ms", "band-mask peak MiB", "full SDPA ms", "full SDPA peak MiB"]
    line = source(name, data, record="sliding_window")
    skipped = "Skipped: " + "; ".join(notes) + "." if notes else ""
    return "\n\n".join(part for part in (table(headers, rows, left=1), skipped, line) if part)


SCHEMES = {"sinusoidal": "sinusoidal (the paper)", "relative": "relative (T5 bias)"}


def positions_extrapolation() -> str:
    data = load("positions")["extrapolation"]
    rows = []
    for r in data["results"]:
        exact, agree = r["exact_match"], r["token_agreement"]
        rows.append(
            [SCHEMES.get(r["scheme"], r["scheme"])]
            + [f"{exact[k]:.1f}%" for k in ("in", "64", "128")]
            + [f"{agree[k]:.1f}%" for k in ("in", "64", "128")]
        )
    headers = ["scheme", "exact, 1-32", "exact, 64", "exact, 128"]
    headers += ["agreement, 1-32", "agreement, 64", "agreement, 128"]
    line = source("positions", data, record="extrapolation")
    return table(headers, rows, left=1) + "\n\n" + line


def positions_bible() -> str:
    data = load("positions")["bible"]
    best = max(r["bleu"] for r in data["results"])
    rows = []
    for r in data["results"]:
        bold = "**{}**" if r["bleu"] == best else "{}"
        rows.append(
            [
                SCHEMES.get(r["scheme"], r["scheme"]),
                bold.format(f"{r['bleu']:.2f}"),
                bold.format(f"{r['chrf']:.2f}"),
                f"{r['steps']:,}",
                f"{r['epochs']:.2f}",
            ]
        )
    headers = ["scheme", "test BLEU", "chrF", "steps in 15 min", "epochs"]
    line = source("positions", data, record="bible")
    return table(headers, rows, left=1) + "\n\n" + line


PRUNED_KINDS = {"encoder.self": "encoder self", "decoder.self": "decoder self"}
PRUNED_KINDS["decoder.cross"] = "encoder-decoder"


def pruning() -> str:
    data = load("pruning")
    results = data["results"]
    (unpruned,) = [r for r in results if r["kind"] is None]
    heads = {round(r["heads_removed"] / r["fraction"]) for r in results if r["kind"]}
    (total,) = heads
    bleu = f"{unpruned['bleu']:.2f}"
    rows = [["(none)", f"0 of {total}", bleu, bleu]]
    for kind, label in PRUNED_KINDS.items():
        for fraction in sorted({r["fraction"] for r in results if r["kind"] == kind}):
            same = [r for r in results if r["kind"] == kind and r["fraction"] == fraction]
            (ranked,) = [r for r in same if r["order"] == "importance"]
            random = statistics.mean(r["bleu"] for r in same if r["order"].startswith("random"))
            rows.append(
                [
                    label,
                    f"{ranked['heads_removed']} of {total}",
                    f"{ranked['bleu']:.2f}",
                    f"{random:.2f}",
                ]
            )
    headers = ["attention", "pruned", "BLEU, least important first", "BLEU, random order"]
    return table(headers, rows) + "\n\n" + source("pruning", data)


def serve(name: str) -> str:
    """bench_serve.py: the batching server against one at a time, per number of clients."""
    data = load(name)
    rows = [
        [
            str(c["clients"]),
            c["server"],
            number(c["sentences_per_s"]),
            number(c["p50_ms"]),
            number(c["p95_ms"]),
            number(c["p99_ms"]),
            number(c["mean_batch"]),
            str(c["refused_429"]),
            ratio(c["speedup"]),
        ]
        for c in data["cells"]
    ]
    headers = ["clients", "server", "sentences/s", "p50 ms", "p95 ms", "p99 ms", "mean batch"]
    headers += ["429s", "vs one at a time"]
    batching = (
        f"the batching server with --continuous {data['continuous']}"
        if data.get("continuous")
        else f"--max-wait-ms {data['max_wait_ms']:g}"
    )
    settings = f"Beam {data['beam']}, {batching}, "
    settings += f"{data['threads']} torch thread per server, {data['rounds']} rounds per cell."
    return settings + "\n\n" + table(headers, rows) + "\n\n" + source(name, data, needs_quiet=True)


SHAPE_FILES = ("shapes", "shapes-prefix-lm")  # bench_shapes.py --name: runs added later

SHAPE_NAMES = {
    "encdec": ("encoder-decoder (the paper)", "`bible-en-es-cpu`"),
    "gpt-translate": ("decoder-only translator", "`gpt-translate-bible-en-es-cpu`"),
    "prefix-lm": ("prefix-LM translator", "`prefix-lm-translate-bible-en-es-cpu`"),
    "gpt": ("GPT (decoder-only LM)", "`gpt-bible-en-cpu`"),
    "bert": ("BERT (encoder-only MLM)", "`bert-bible-en-cpu`"),
    "bert-prenorm": ("BERT, pre-norm", "`bert-bible-en-cpu` `model.norm_first=true`"),
}


def shapes() -> str:
    """bench_shapes.py: one row per model shape, each trained with its recipe; the runs of
    the files in `SHAPE_FILES` after shapes.json's own (each file keeps its provenance)."""
    files = {name: load(name) for name in SHAPE_FILES if (RESULTS / f"{name}.json").exists()}
    runs = {r["shape"]: r for data in files.values() for r in data["runs"]}
    rows = []
    for key, (label, recipe) in SHAPE_NAMES.items():
        if key not in runs:
            continue
        r, test = runs[key], runs[key]["test"]
        if "greedy_bleu" in test:
            score = f"{test['greedy_bleu']:.2f} BLEU (greedy, en→es)"
        elif "masked_accuracy" in test:
            score = f"masked-token accuracy {100 * test['masked_accuracy']:.1f}%"
        else:
            score = f"perplexity {test['ppl']:.1f}"
        rows.append(
            [
                label,
                recipe,
                f"{r['parameters']:,}",
                f"{r['steps']:,}",
                f"{r['epochs']:.2f}",
                f"{number(r['tokens_per_s'])} ({number(r['target_tokens_per_s'])})",
                score,
            ]
        )
    headers = ["shape", "recipe", "parameters", "updates", "epochs"]
    headers += ["training tokens/s (target tokens/s)", "test"]
    notes = [
        f"Conditions of `{name}.json`: {data['conditions']}.\n\n" + source(name, data)
        for name, data in files.items()
    ]
    return table(headers, rows) + "\n\n" + "\n\n".join(notes)


def generate(name: str) -> str:
    """bench_generate.py: aiayn's tokens/s against transformers' generate, same weights."""
    data = load(name)
    cells: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for r in data["results"]:
        cells.setdefault((r["size"], r["batch"]), {})[r["system"]] = r
    rows = []
    for (size, batch), by in cells.items():
        ours, ours16 = by["aiayn"], by["aiayn-bf16"]  # ratios: medians over rounds
        rows.append(
            [
                "GPT-2 small" if size == "gpt2-small" else size,
                str(batch),
                number(ours["tokens_per_s"]),
                number(ours16["tokens_per_s"]),
                f"**{ratio(ours['speedup_vs_hf_fp32'])}**",
                ratio(ours16["speedup_vs_hf_fp32"], "†"),
                ratio(ours16["speedup_vs_hf"]),
            ]
        )
    headers = ["shape", "batch", "aiayn fp32 tok/s", "aiayn bf16 tok/s"]
    headers += ["aiayn / HF, fp32", "aiayn bf16 / HF fp32", "aiayn / HF, bf16"]
    notes = "† across precisions."
    return "\n\n".join([table(headers, rows), notes, source(name, data, needs_quiet=True)])


def step_overhead(name: str = "step-overhead") -> str:
    """bench_static_step --marian: one decoding step per system and slot count, with
    aiayn's time outside matrix products, beside CTranslate2's whole step."""
    data = load(name)
    labels = {
        "cache": "aiayn, cached step (today's)",
        "static": "aiayn, static step, eager",
        "compiled": "aiayn, static step, torch.compile",
        "aoti": "aiayn, static step, AOTInductor",
        "ct2-fp32": "CTranslate2 fp32",
        "ct2-int8": "CTranslate2 int8",
    }

    def cell(value: float | None) -> str:
        return "" if value is None else number(value)

    rows = [
        [
            str(r["slots"]),
            labels.get(r["system"], r["system"]),
            cell(r.get("ms_per_step")),
            cell(r.get("outside_gemm_ms")),
            "" if r["system"].startswith("ct2") else cell(r.get("compile_s")),
        ]
        for r in data["results"]
    ]
    headers = ["slots", "system", "ms/step", "outside GEMM ms", "compile s"]
    said = (
        f"Greedy steps of the `{data['args']['size']}` shape (a random Marian, the same "
        f"weights in both), median of {data['args']['steps']}"
        + (
            f" steps, then the median over {rounds} rounds, the systems taking turns."
            if (rounds := data["args"].get("rounds", 1)) > 1
            else "."
        )
    )
    return "\n\n".join([said, table(headers, rows, left=2), source(name, data, needs_quiet=True)])


def generate_engine(name: str = "generate-engine") -> str:
    """bench_generate.py --systems aiayn,hf,aiayn-static: per shape and batch, each
    system's tokens/s and its ratio to HF generate (fp32)."""
    data = load(name)
    labels = {"aiayn": "aiayn", "hf": "HF generate", "aiayn-static": "aiayn, static step"}
    rows = [
        [
            "GPT-2 small" if r["size"] == "gpt2-small" else r["size"],
            str(r["batch"]),
            labels.get(r["system"], r["system"]),
            number(r["tokens_per_s"]),
            number(r["ms_per_call"]),
            ratio(r["speedup_vs_hf"]),
        ]
        for r in data["results"]
    ]
    headers = ["shape", "batch", "system", "new tok/s", "ms/call", "vs HF"]
    return table(headers, rows) + "\n\n" + source(name, data, needs_quiet=True)


def span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return ratio(low) if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}x to {high:.2f}x"


# The decoding-engine issue's serving and file-translation goals: the results files
# they are judged from, once those exist.
ENGINE_FILES = {
    "serve": "serve-continuous-groups",
    "translate": "translate",
    "generate": "generate-engine",
    "overhead": "step-overhead",
}


def engine_goals(names: list[str]) -> list[list]:
    """Goal rows from those of ENGINE_FILES in `names`: the continuous engine's serving
    speed-up over one-at-a-time at 16 and 64 clients (goals 5x and 8x), and a file's
    translation against today's batches (goal 2x)."""
    rows: list[list] = []
    if ENGINE_FILES["serve"] in names:
        served = load(ENGINE_FILES["serve"])["cells"]
        for clients, goal in ((16, 5.0), (64, 8.0)):
            speedup = [
                c["speedup"]
                for c in served
                if c["clients"] == clients and c["server"] == "batching"
            ]
            work = f"serving, {clients} clients"
            rows.append([work, "continuous engine / one at a time", "fp32", speedup, goal])
    if ENGINE_FILES["translate"] in names:
        cells = load(ENGINE_FILES["translate"])["cells"]
        speedup = [c["speedup_vs_batches"] for c in cells if c["system"].startswith("continuous")]
        work = "translating a file, beam 8"
        rows.append([work, "continuous engine / batches", "fp32", speedup, 2.0])
    if ENGINE_FILES["generate"] in names:
        results = load(ENGINE_FILES["generate"])["results"]
        speedup = [
            r["speedup_vs_hf"]
            for r in results
            if r["size"] == "gpt2-small" and r["batch"] == 1 and r["system"].startswith("aiayn")
        ]
        work = "GPT-2 small generation, batch 1"
        rows.append([work, "aiayn / HF generate", "fp32", speedup, 1.5])
    if ENGINE_FILES["overhead"] in names:
        by = {(r["system"], r["slots"]): r for r in load(ENGINE_FILES["overhead"])["results"]}
        outside = by.get(("cache", 1), {}).get("outside_gemm_ms")
        for peer, precision in (("ct2-fp32", "fp32"), ("ct2-int8", "CTranslate2 in int8")):
            whole = by.get((peer, 1), {}).get("ms_per_step")
            if outside and whole:
                work = "decoding step, batch 1"
                said = "CTranslate2's whole step / aiayn's step outside GEMM"
                rows.append([work, said, precision, [whole / outside], 1.0])
    return rows


def goals() -> str:
    """The issue's goals, each compared within one precision, from the decode and train files."""
    decode_data = load("decode")
    decode_rows = [r for r in decode_records(decode_data) if r["batch"] != 1]
    by = {(r["size"], r["search"], r["system"]): r for r in decode_rows}
    train_rows = [
        r
        for name in TRAIN_FILES
        if (RESULTS / f"{name}.json").exists()
        for r in load(name)["results"]
    ]

    def decode_vs(system: str, field: str) -> list[float]:
        return [r[field] for r in decode_rows if r["system"] == system and r[field] is not None]

    def train_vs(system: str, field: str) -> list[float]:
        return [r[field] for r in train_rows if r["system"] == system and r[field] is not None]

    bf16_over_fp32 = [
        per_round_ratio(r["times_s"], by[size, search, "aiayn-bf16"]["times_s"])
        for (size, search, system), r in by.items()
        if system == "aiayn" and (size, search, "aiayn-bf16") in by
    ]
    rows = [
        [
            "decoding, batch 32",
            "aiayn / HF generate",
            "fp32",
            decode_vs("aiayn", "speedup_vs_hf"),
            2.0,
        ],
        [
            "decoding, batch 32",
            "aiayn / HF generate",
            "bf16",
            decode_vs("aiayn-bf16", "speedup_vs_hf"),
            2.0,
        ],
        [
            "decoding, batch 32",
            "aiayn / CTranslate2",
            "fp32",
            decode_vs("aiayn", "speedup_vs_ct2_fp32"),
            None,
        ],
        [
            "decoding, batch 32",
            "aiayn bf16 / aiayn fp32",
            "across precisions",
            bf16_over_fp32,
            None,
        ],
        [
            "training step",
            "aiayn / HF MarianMTModel",
            "fp32",
            train_vs("aiayn", "speedup_vs_hf"),
            1.2,
        ],
        [
            "training step",
            "aiayn / torch.nn.Transformer",
            "fp32",
            train_vs("aiayn", "speedup_vs_torch_nn"),
            None,
        ],
        [
            "training step",
            "aiayn / HF MarianMTModel",
            "bf16 autocast",
            train_vs("aiayn-bf16", "speedup_vs_hf"),
            1.2,
        ],
    ]
    fair = has_cells("decode-fair")  # the decoding-engine issue's race, when it has run
    if fair:  # every cell at 1 and 2 threads; "best" fixed in advance
        cell_records = load("decode-fair")["cells"]
        work, best_is, goal = "decoding, every cell, 1 and 2 threads", "fixed in advance", 1.0
    elif "cells" in decode_data:  # issue 17: all 8 cells, at the first thread count
        cell_records = decode_records(decode_data, "cells")
        work, best_is, goal = "decoding, every cell", "best of the run's --best-of", 1.2
    if fair or "cells" in decode_data:
        best = [c["best_vs_ct2_int8"] for c in cell_records if c["best_vs_ct2_int8"]]
        fp32 = [c["fp32_vs_ct2_fp32"] for c in cell_records if c["fp32_vs_ct2_fp32"]]
        rows[4:4] = [  # after the batch-32 decoding rows, before training's
            [work, "aiayn best / CTranslate2 int8", best_is, best, goal],
            [work, "aiayn / CTranslate2", "fp32", fp32, 1.0],
        ]
    engine_files = [name for name in ENGINE_FILES.values() if (RESULTS / f"{name}.json").exists()]
    rows += engine_goals(engine_files)
    cells = []
    for work, systems, precision, values, goal in rows:
        if not values:
            continue
        met = "" if goal is None else ("yes" if min(values) >= goal else "no")
        goal_cell = "" if goal is None else f"{goal:g}x"
        cells.append([work, systems, precision, span(values), goal_cell, met])
    headers = [
        "work",
        "speed ratio",
        "precision",
        "measured (the rows of the tables below)",
        "goal",
        "met",
    ]
    files = ", ".join(
        f"`benchmarks/results/{name}.json`"
        for name in ("decode", *(["decode-fair"] if fair else []), *TRAIN_FILES, *engine_files)
        if (RESULTS / f"{name}.json").exists()
    )
    return table(headers, cells, left=3) + (
        f"\n\nComputed from {files}; their Source lines are under the tables they come "
        "from, on the Speed, CPU inference and decoding-engine pages."
    )


# ----- int8 and the output shortlist: quality on a trained model, memory ----------------

QUALITY_LABELS = {
    "fp32": "fp32",
    "bf16": "bf16 (weights cast)",
    "int8": "int8 as `--dtype int8` runs this model: the FFN",
    "int8-layers": "int8 in every layer product (as in the small and base shapes)",
    "int8-layers-per-tensor": "the same, one activation scale per product, not per token",
    "int8-all": "int8 in every layer product and the output projection",
    "int8-shortlist": "int8 in every layer product + shortlist",
    "fp32-shortlist": "fp32 + shortlist",
}


def quality() -> str:
    """BLEU, chrF and greedy agreement of each inference setting on the trained quickstart."""
    data = load("quality")
    rows = data["results"]
    fp32 = next(r for r in rows if r["setting"] == "fp32")
    n = data["sentences"]
    lines = [
        [
            QUALITY_LABELS.get(r["setting"], r["setting"]),
            f"{r['bleu']:.2f}",
            f"{r['bleu'] - fp32['bleu']:+.2f}",
            f"{r['chrf']:.2f}",
            f"{r['greedy_same_as_fp32']}/{n} ({100 * r['greedy_same_as_fp32'] / n:.1f}%)",
        ]
        for r in rows
    ]
    headers = ["setting", "BLEU", "vs fp32", "chrF", "greedy output identical to fp32's"]
    shortlist = data["shortlist"]
    notes = (
        f"{n} test verses, beam 4, alpha 0.6 (sacreBLEU {data['bleu_signature']}); the last "
        "column decodes greedily. Shortlist: the corpus's `shortlist.safetensors` "
        f"({shortlist['frequent']:,} most frequent pieces + {shortlist['per_source']} "
        f"translations per source piece, from the training pairs): "
        f"{shortlist['mean_candidates']:,.0f} candidates per sentence on average (of "
        f"{shortlist['vocab_size']:,}), recall {100 * shortlist['recall']:.1f}% (the share of "
        "reference pieces in their sentence's candidates). int8 quantizes products of "
        f"{data['int8_min_elements']:,} weights and more (`INT8_MIN_ELEMENTS`)."
    )
    return "\n\n".join([table(headers, lines, left=1), notes, source("quality", data)])


def quality_seeds() -> str:
    """Each precision against fp32 on several runs: the paired-bootstrap difference per run."""
    data = load("quality-seeds")
    runs = data["runs"]
    settings = [r["setting"] for r in runs[0]["results"]]
    by = [{r["setting"]: r for r in run["results"]} for run in runs]
    n = runs[0]["sentences"]
    headers = [
        "setting",
        *[f"seed {run['seed']}" for run in runs],
        "greedy output identical to fp32's",
    ]
    lines = [
        [
            "fp32 (BLEU)",
            *[f"{rows['fp32']['bleu']:.2f}" for rows in by],
            f"{n}/{n} in each run",
        ]
    ]
    for setting in settings[1:]:
        cells = [
            f"{r['vs_fp32']:+.2f} [{r['vs_fp32_low']:+.2f}, {r['vs_fp32_high']:+.2f}], "
            f"p {r['p_value']:.2f}"
            for r in (rows[setting] for rows in by)
        ]
        same = [rows[setting]["greedy_same_as_fp32"] for rows in by]
        greedy = ", ".join(f"{100 * s / n:.1f}%" for s in same)
        lines.append([QUALITY_LABELS.get(setting, setting), *cells, greedy])
    notes = (
        f"Each cell: the setting's sacreBLEU minus fp32's on the same run, [its 95% interval], "
        f"and sacreBLEU's paired bootstrap p-value ({data['resamples']:,} resamples of the "
        f"{n} {data['split']} verses). Beam {data['beam']}, alpha {data['alpha']:g} (the "
        f"quickstart's decoding), the weights the quickstart scores: "
        f"{weights_label(runs[0]['weights_rule'])}; the last column decodes greedily "
        f"(sacreBLEU {runs[0]['bleu_signature']}). int8 quantizes products of "
        f"{data['int8_min_elements']:,} weights and more (`INT8_MIN_ELEMENTS`)."
        + (f" The runs: {data['note']}" if data.get("note") else "")
    )
    return "\n\n".join(
        [table(headers, lines, left=1), notes, source("quality-seeds", data, timed=False)]
    )


def valid_runs(data: dict[str, Any]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """The runs of a valid sweep, grouped by their recipe overrides (() is the recipe)."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for run in data["runs"]:
        groups.setdefault(tuple(run["overrides"]), []).append(run)
    return groups


def valid_bleu(run: dict[str, Any], beam: int, alpha: float) -> float | None:
    found = [s["bleu"] for s in run["searches"] if s["beam"] == beam and s["alpha"] == alpha]
    return found[0] if found else None


def median_span(values: list[float]) -> str:
    """'21.40' for one value, `median_range`'s '21.40 (20.95-22.10)' for several."""
    return f"{values[0]:.2f}" if len(values) == 1 else median_range(values)


def valid_variants() -> str:
    """Recipe variants against the recipe, on the valid split, at the quickstart's decoding."""
    data = load("valid-sweep")
    groups = valid_runs(data)
    lines = []
    for overrides, runs in sorted(groups.items(), key=lambda item: len(item[0])):
        label = "the recipe" if not overrides else ", ".join(f"`{o}`" for o in overrides)
        lines.append(
            [
                label,
                ", ".join(str(r["seed"]) for r in runs),
                f"{statistics.median(r['parameters'] for r in runs) / 1e6:.1f}M",
                f"{statistics.median(r['steps'] for r in runs):,.0f}",
                median_span([r["best_valid_loss"] for r in runs]),
                median_span([valid_bleu(r, 1, 0.0) for r in runs]),
                median_span([valid_bleu(r, 8, 1.0) for r in runs]),
            ]
        )
    headers = [
        "recipe",
        "seeds",
        "parameters",
        "updates",
        "best valid loss",
        "valid BLEU, greedy",
        "valid BLEU, beam 8 alpha 1",
    ]
    runs = data["runs"]
    notes = (
        f"Valid split ({runs[0]['sentences']} verses), the weights the quickstart scores: "
        f"{weights_label(runs[0]['weights_rule'])}; sacreBLEU {runs[0]['bleu_signature']}; "
        "median (range) over the seeds where there are several. "
        f"{runs[0]['minutes']:g} minutes of training each. " + data.get("note", "")
    )
    return "\n\n".join(
        [table(headers, lines, left=2), notes, source("valid-sweep", data, timed=False)]
    )


def valid_searches() -> str:
    """Valid BLEU of the recipe's runs under each beam and length penalty."""
    data = load("valid-sweep")
    runs = valid_runs(data).get((), [])
    searches = [(s["beam"], s["alpha"]) for s in runs[0]["searches"]] if runs else []
    lines = []
    for beam, alpha in searches:
        scores = [valid_bleu(r, beam, alpha) for r in runs]
        search = "greedy" if beam == 1 else f"beam {beam}, alpha {alpha:g}"
        mark = " (the quickstart's)" if (beam, alpha) == (8, 1.0) else ""
        lines.append(
            [search + mark, *[f"{v:.2f}" for v in scores], f"{statistics.median(scores):.2f}"]
        )
    headers = ["search", *[f"seed {r['seed']}" for r in runs], "median"]
    notes = "The recipe's runs of the table above, valid split, the same weights."
    return "\n\n".join(
        [table(headers, lines, left=1), notes, source("valid-sweep", data, timed=False)]
    )


def induction() -> str:
    """The induction-head runs: in-context loss over training and the final best heads."""
    data = load("induction")
    lines = []
    for run in data["runs"]:
        curve, model = run["curve"], run["model"]
        lowest = min(curve, key=lambda r: r["in_context_loss"])
        heads = ", ".join(
            f"L{h['layer']}H{h['head']} {h['score']:.2f}" for h in run["top_induction"]
        )
        lines.append(
            [
                "attention-only" if model["d_ff"] == 0 else f"with FFN (d_ff {model['d_ff']})",
                f"{curve[-1]['step']:,}",
                f"{curve[-1]['loss']:.2f}",
                f"{curve[0]['in_context_loss']:+.2f} (update {curve[0]['step']:,})",
                f"{lowest['in_context_loss']:+.2f} (update {lowest['step']:,})",
                f"{curve[-1]['in_context_loss']:+.2f}",
                heads,
            ]
        )
    headers = [
        "model",
        "updates",
        "valid loss",
        "in-context loss, first",
        "lowest",
        "last",
        "best induction heads (prefix matching)",
    ]
    first = data["runs"][0]["model"]
    notes = (
        f"2 layers, d_model {first['d_model']}, {first['n_heads']} heads, blocks of "
        f"{first['max_len']} tokens. In-context loss: the validation loss in the block's last "
        "tenth minus around its first tenth (nats; below 0: later tokens are predicted "
        "better, from the context). Prefix matching: on repeated random tokens, a head's "
        "attention from a token of the second repeat to the token after its first "
        "occurrence (1 is a perfect induction head). "
        + data.get("note", "")
        + " The curve: `benchmarks/results/induction.png`."
    )
    return "\n\n".join(
        [table(headers, lines, left=1), notes, source("induction", data, timed=False)]
    )


def alignment() -> str:
    """Cross-attention word alignment of the quickstart model: AER against IBM Model 1."""
    data = load("alignment")
    aer = data["aer"]
    best = f"layer {data['best_layer']}"
    described = {"rollout": "attention rollout", "diagonal": "diagonal (reads no model)"}
    rows = [
        [described.get(name, name) + (" (best layer)" if name == best else ""), f"{value:.3f}"]
        for name, value in aer.items()
    ]
    model, results = data["model"], data.get("run_results", {})
    bleu = f", test BLEU {results['bleu']}" if "bleu" in results else ""
    notes = (
        f"{data['pairs']} test verses ({data['skipped']} left out), {model['n_decoder_layers']} "
        f"decoder layers of {model['n_heads']} heads{bleu}. Reference: IBM Model 1 ("
        f"{data['model1_iterations']} EM iterations on {data['model1_pairs']:,} pairs: the "
        "train split and the aligned verses); AER = 1 - 2|A∩R|/(|A|+|R|), summed over the "
        "verses, 0 where attention links as Model 1 does. It measures agreement with "
        "Model 1, which is itself often wrong. Run: " + data.get("note", "")
    )
    return "\n\n".join(
        [
            table(["alignment", "AER vs Model 1"], rows, left=1),
            notes,
            source("alignment", data, timed=False),
        ]
    )


def export() -> str:
    """The quickstart model exported to CTranslate2: each quantization's test BLEU."""
    data = load("export")
    rows = [
        [
            q["quantization"],
            f"{q['bleu']:.2f}",
            f"{q['chrf']:.2f}",
            f"{q['bleu_against_float32']:.2f}",
            f"{q['same_as_float32']:.0%}",
        ]
        for q in data["quantizations"]
    ]
    headers = [
        "CTranslate2 compute type",
        "test BLEU",
        "chrF",
        "BLEU vs float32",
        "same as float32",
    ]
    notes = (
        f"{data['sentences']} test verses, beam {data['beam']}, alpha {data['alpha']} "
        "(CTranslate2's length penalty |Y|^alpha, not aiayn's GNMT form); aiayn's own test "
        f"BLEU of the same weights: {data['quickstart_bleu']}. Run: " + data["args"].get("note", "")
    )
    return "\n\n".join([table(headers, rows, left=1), notes, source("export", data, timed=False)])


def hooks() -> str:
    """What the hook points cost when nothing listens (bench_hooks)."""
    data = load("hooks")
    rows = []
    for name, r in data["results"].items():
        ratios = [a / b for a, b in zip(r["shipped_s"], r["without_hook_points_s"], strict=True)]
        rows.append(
            [
                name,
                f"{statistics.median(r['shipped_s']) * 1e3:.1f}",
                f"{statistics.median(r['without_hook_points_s']) * 1e3:.1f}",
                f"{r['ratio']:.3f}",
                f"{min(ratios):.2f}-{max(ratios):.2f}",
            ]
        )
    headers = ["workload", "shipped ms", "without hook points ms", "ratio", "per-round range"]
    notes = (
        "The quickstart's shape (d_model 128, 3+3 layers, 8,000 pieces), fp32: a training "
        "step of 32 x 30 tokens, forward and backward; greedy decoding of 8 sentences, 30 "
        "steps. Ratio: shipped over without, the median of per-round ratios, the two "
        "taking turns call by call (1.00: no cost)."
    )
    return "\n\n".join([table(headers, rows, left=1), notes, source("hooks", data)])


def int8_kernels() -> str:
    """Each int8 candidate's speed against float32, per weight shape and row count."""
    data = load("int8-kernels")
    records = data["results"]
    systems = [s for s in dict.fromkeys(r["system"] for r in records) if s != "fp32"]
    cells: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for r in records:
        cells.setdefault((r["shape"], r["rows"]), {})[r["system"]] = r
    rows = []
    for (shape, n_rows), by in cells.items():
        best = max(systems, key=lambda s: by[s]["vs_fp32"] if s in by else 0.0)
        rows.append(
            [
                shape,
                str(n_rows),
                number(by["fp32"]["us"]),
                *(
                    ""
                    if s not in by
                    else (
                        f"**{ratio(by[s]['vs_fp32'])}**" if s == best else ratio(by[s]["vs_fp32"])
                    )
                    for s in systems
                ),
            ]
        )
    headers = ["weight (out x in)", "rows", "fp32 us", *systems]
    notes = (
        "Speed of one product against aiayn's float32 product (> 1: faster), median of "
        "per-round ratios; the fastest int8 candidate of each row in bold. Shapes: "
        + "; ".join(
            f"{name} {out} x {inp}"
            for name, out, inp in dict.fromkeys((r["shape"], r["out"], r["inp"]) for r in records)
        )
        + "."
    )
    return "\n\n".join([table(headers, rows), notes, source("int8-kernels", data)])


def memory() -> str:
    """What a frozen model holds in memory, today against the commit before."""
    data = load("memory")
    rows = [
        [
            r["size"],
            f"{r['code']} (`{r['commit']}`)",
            r["dtype"],
            f"{r['weights_mb']:,.0f}",
            f"{r['with_model_mb']:,.0f}",
            f"{r['held_mb']:,.0f} ({r['held_mb'] / r['weights_mb']:.2f}x)",
        ]
        for r in data["results"]
    ]
    headers = ["shape", "code", "dtype", "fp32 weights, MiB"]
    headers += ["model + frozen copy, MiB", "frozen copy alone, MiB (x weights)"]
    notes = (
        "Resident memory (VmRSS) a process gains by loading a random-weight Marian model "
        "and freezing it (`bench_memory.py`, median of 3 fresh processes): with the literal "
        "model still loaded (as `Translator` keeps it, for attention maps), and after "
        "deleting it and returning glibc's freed blocks (`malloc_trim`)."
    )
    return "\n\n".join([table(headers, rows), notes, source("memory", data)])


# ----- the quickstart: seeds and the step profile ---------------------------------------

# `benchmarks/record_quickstart.py` writes these; the release step (`benchmarks/release.py`)
# renders the packaged reference that `aiayn quickstart` prints next to its BLEU from them.
QUICKSTART_PREFIX = "quickstart-"


QuickstartKey = tuple[str, str, float, str, str, tuple[str, ...], Any, Any, str]


def weights_rule(run: dict[str, Any]) -> str:
    """The rule that picked a recorded run's weights (`aiayn.apps.quickstart.evaluated_weights`):
    its "weights_rule", or, in files written before that field, read from the weights
    path (RUN/checkpoints/best, average-last-K or step-N); "?" where neither says."""
    if run.get("weights_rule"):
        return run["weights_rule"]
    folder = Path(run.get("weights", "")).parent.name
    if folder == "best" or folder.startswith("average-last-"):
        return folder
    return "last" if folder.startswith("step-") else "?"


def quickstart_groups() -> dict[QuickstartKey, list[tuple[str, dict[str, Any]]]]:
    """The recorded quickstart runs by (recipe, recipe version, minutes, device kind,
    machine, overrides, beam, alpha, weights rule), as (name, data). The version is the
    recipe file's digest (`aiayn.apps.quickstart.recipe_digest`), "" where a run did not
    record one; beam and alpha are "?" where it did not record them."""
    groups: dict[QuickstartKey, list[tuple[str, dict[str, Any]]]] = {}
    for path in sorted(RESULTS.glob(f"{QUICKSTART_PREFIX}*.json")):
        data = load(path.stem)
        run = data["results"]
        key = (
            Path(run["recipe"]).name,
            run.get("recipe_sha256") or "",
            run["minutes"],
            run["device"].split(":")[0],
            data.get("machine", "machine not recorded"),
            tuple(run.get("overrides", [])),
            run.get("beam", "?"),
            run.get("alpha", "?"),
            weights_rule(run),
        )
        groups.setdefault(key, []).append((path.stem, data))

    def order(item):
        (name, digest, minutes, device, _, overrides, beam, alpha, rule) = item[0]
        current = digest != packaged_digest(name)
        return (current, overrides, name, digest, minutes, device, str(beam), str(alpha), rule)

    return dict(sorted(groups.items(), key=order))


def packaged_digest(name: str) -> str | None:
    """The packaged recipe NAME's version now, as `aiayn.apps.quickstart.recipe_digest` writes
    it (the first 12 hex digits of the file's SHA-256); None if no such recipe is packaged."""
    path = ROOT / "src" / "aiayn" / "configs" / name
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path.is_file() else None


def version_label(name: str, digest: str) -> str:
    """`1a2b3c4d (current)` for the packaged recipe's own version, `not recorded` without one."""
    if not digest:
        return "not recorded"
    return f"`{digest[:8]}`" + (" (current)" if digest == packaged_digest(name) else "")


def median_range(values: list[float]) -> str:
    """The median, then the lowest and the highest: 21.50 (19.25-24.00)."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


WEIGHTS_LABELS = {"best": "best (valid loss)", "last": "last"}


def weights_label(rule: str) -> str:
    """ "best (valid loss)", "average of last 3", "last" or "?"."""
    if rule.startswith("average-last-"):
        return f"average of last {rule.removeprefix('average-last-')}"
    return WEIGHTS_LABELS.get(rule, rule)


def quickstart() -> str:
    """Per recipe, training minutes and scoring (beam, alpha, weights): test BLEU and
    chrF over seeds, and the budget."""
    groups = quickstart_groups()
    if not groups:
        return "No quickstart run is recorded yet (see `benchmarks/record_quickstart.py`)."
    rows, sources = [], []
    for key, recorded in groups.items():
        (recipe, digest, minutes, device, _, overrides, beam, alpha, rule) = key
        runs = [data["results"] for _, data in recorded]
        speeds = [r["budget"]["tokens_per_s"] for r in runs if r.get("budget")]
        rows.append(
            [
                " ".join([recipe, *(f"`{o}`" for o in overrides)]),
                version_label(recipe, digest),
                device,
                f"{minutes:g}",
                ", ".join(str(r["seed"]) for r in sorted(runs, key=lambda r: r["seed"])),
                str(beam),
                str(alpha),
                weights_label(rule),
                median_range([r["bleu"] for r in runs]),
                median_range([r["chrf"] for r in runs]),
                number(statistics.median(r["steps"] for r in runs)),
                f"{statistics.median(r['epochs'] for r in runs):.2f}",
                number(statistics.median(speeds)) if speeds else "not recorded",
            ]
        )
        sources += [source(name, data) for name, data in recorded]
    headers = ["recipe", "version", "device", "minutes", "seeds", "beam", "alpha", "weights"]
    headers += ["test BLEU median (range)", "chrF median (range)", "steps", "epochs"]
    headers += ["tok/s (src+tgt)"]
    return table(headers, rows, left=8) + "\n\n" + "\n\n".join(sources)


def quickstart_reference() -> dict[str, Any]:
    """The packaged reference: per recipe, minutes, device kind, machine, overrides and
    scoring (beam, alpha, weights rule), the seeds' BLEU and chrF (the quickstart prints
    their median and range next to its own, for a run scored the same way)."""
    references = []
    groups = quickstart_groups().items()
    for key, recorded in groups:
        (recipe, digest, minutes, device, machine, overrides, beam, alpha, rule) = key
        runs = sorted(
            ((data["results"], name) for name, data in recorded), key=lambda x: x[0]["seed"]
        )
        references.append(
            {
                "recipe": recipe,
                "recipe_sha256": digest or None,
                "minutes": minutes,
                "device": device,
                "machine": machine,
                "overrides": list(overrides),
                "beam": None if beam == "?" else beam,
                "alpha": None if alpha == "?" else alpha,
                "weights": None if rule == "?" else rule,
                "seeds": [r["seed"] for r, _ in runs],
                "bleu": [r["bleu"] for r, _ in runs],
                "chrf": [r["chrf"] for r, _ in runs],
                "files": [f"benchmarks/results/{name}.json" for _, name in runs],
            }
        )
    note = "written by `python -m benchmarks.release` from benchmarks/results/quickstart-*.json"
    return {"note": note, "references": references}


def has_quickstart_runs() -> bool:
    return any(RESULTS.glob(f"{QUICKSTART_PREFIX}*.json"))


def train_profile(name: str = "train-profile") -> str:
    """Where a quickstart training step's time goes, by op kind, and the share of peak."""
    data = load(name)
    rows = [
        [kind["kind"], f"{kind['ms_per_step']:.2f}", f"{kind['percent']:.1f}%"]
        for kind in data["kinds"]
    ]
    rows.append(["**a step**", f"**{data['ms_per_step']:.2f}**", "100%"])
    text = table(["op kind", "ms per step", "share"], rows, left=1)
    peaks = "; ".join(
        f"{p['percent_reached']:.1f}% of the {dtype} peak ({number(p['gflops'])} GFLOP/s on "
        f"{'x'.join(map(str, p['shape']))}, {p['threads']} threads)"
        for dtype, p in data["peak"].items()
    )
    text += (
        f"\n\n{data['steps']} steps of `{data['recipe']}` ({data.get('precision', 'fp32')}) "
        f"after {data['warmup']} warm-up, "
        f"{number(data['tgt_tokens_per_step'])} target tokens a step: "
        f"{number(data['tgt_tokens_per_s'])} target tok/s, "
        f"{number(data['achieved_gflops'])} GFLOP/s of matrix products "
        f"({number(data['matmul_flops_per_step'] / 1e9)} GFLOP a step, `aiayn.training.budget`): {peaks}."
    )
    return text + "\n\n" + source(name, data)


def efficient_attention(name: str = "attention") -> str:
    """bench_attention --only efficient: each kernel's training pass by length, the
    crossover against SDPA, and the causal kernels' decoding step by position."""
    data = load(name)["efficient"]
    kernels = ("sdpa", "sliding_window", "bigbird", "linear", "performer")
    causal = ("sdpa", "sliding_window", "linear", "performer")

    def cell(value: float | None) -> str:
        return "skipped" if value is None else number(value)

    rows = [
        [r["device"], f"{r['length']:,}"]
        + [cell(r[f"{k}_train{field}"]) for k in kernels for field in ("_ms", "_peak_mib")]
        for r in data["results"]
    ]
    headers = ["device", "length"]
    headers += [f"{k} {what}" for k in kernels for what in ("fwd+bwd ms", "peak MiB")]
    crossing = "; ".join(
        f"{device}: "
        + ", ".join(f"{k} {'none' if n is None else f'{n:,}'}" for k, n in found.items())
        for device, found in data["crossover"].items()
    )
    decode_rows = [
        [r["device"], f"{r['position']:,}"]
        + [number(r[f"{k}_{field}"]) for k in causal for field in ("step_ms", "cache_mib")]
        for r in data["decoding"]
    ]
    decode_headers = ["device", "position"]
    decode_headers += [f"{k} {what}" for k in causal for what in ("step ms", "cache MiB")]
    return "\n\n".join(
        [
            table(headers, rows),
            f"First length at which a kernel's forward + backward beats SDPA's: {crossing}.",
            table(decode_headers, decode_rows),
            source(name, data, record="efficient"),
        ]
    )


def sdpa_backends(name: str = "attention-gpu") -> str:
    """bench_attention --only backends: SDPA's CUDA backends, each forced, by length."""
    data = load(name)["backends"]
    kinds = {"flash": "FlashAttention", "efficient": "memory-efficient", "math": "math"}

    def cell(value: float | None) -> str:
        return "—" if value is None else number(value)

    rows = [
        [f"{r['length']:,}"]
        + [cell(r[f"{k}_{field}"]) for k in kinds for field in ("train_ms", "peak_mib")]
        for r in data["results"]
    ]
    headers = ["length"] + [f"{label} {what}" for label in kinds.values() for what in ("ms", "MiB")]
    notes = [
        f"{r['length']:,}, {kinds[k]}: {why}"
        for r in data["results"]
        for k, why in r.get("skipped", {}).items()
    ]
    skipped = "Not run: " + "; ".join(notes) + "." if notes else ""
    parts = (table(headers, rows, left=1), skipped, source(name, data, record="backends"))
    return "\n\n".join(part for part in parts if part)


def translate_file(name: str = "translate") -> str:
    """bench_translate.py: a whole file through `aiayn translate`, batches against the
    continuous engine: sentences/s, the ratio, BLEU and the lines equal to batches'."""
    data = load(name)
    rows = [
        [
            str(c["threads"]),
            f"`{c['system']}`",
            number(c["sentences_per_s"]),
            number(c["seconds"]),
            ratio(c["speedup_vs_batches"]),
            f"{c['bleu']:.2f}",
            "" if c["same_as_batches"] is None else f"{c['same_as_batches']}/{c['sentences']}",
        ]
        for c in data["cells"]
    ]
    headers = ["threads", "system", "sentences/s", "seconds", "vs batches", "BLEU"]
    headers += ["lines equal to batches'"]
    said = (
        f"{data['cells'][0]['sentences']} test sentences, beam {data['beam']}, alpha "
        f"{data['alpha']:g}, median of {data['rounds']} rounds."
    )
    return "\n\n".join([said, table(headers, rows), source(name, data, needs_quiet=True)])


def gpu_train(name: str = "train-gpu-big") -> str:
    """bench_train --device cuda: one shape's bf16 training step per system, with MFU."""
    data = load(name)
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
    data = load(name)
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


def efficient_task(name: str) -> str:
    """bench_efficient: a task's test score per kernel over seeds (accuracy, or bits per
    character), beside the baselines that read no context and, for ListOps, LRA's."""
    data = load(name)
    metric = data.get("metric", "accuracy")
    lra = data.get("lra_listops")
    digits = 1 if metric == "accuracy" else 2  # accuracy in %, bits per character
    rows = []
    for kernel, s in data["kernels"].items():
        best = s.get(f"best_valid_{metric}")
        row = [
            kernel,
            f"{s[f'test_{metric}']:.{digits}f} ± {s[f'test_{metric}_std']:.{digits}f}",
            "—" if best is None else f"{best:.{digits}f}",
            number(s["steps"]),
            number(s["tokens_per_s"]) if "tokens_per_s" in s else "—",
            number(s["peak_mib"]),
        ]
        if lra:
            row.append(f"{lra[kernel]['accuracy']:.1f} ({lra[kernel]['model']})")
        rows.append(row)
    what = "accuracy %" if metric == "accuracy" else "bits per character"
    headers = ["kernel", f"test {what} (mean ± std)", "best valid", "updates", "tokens/s"]
    headers += ["peak MiB"] + (["LRA's ListOps %"] if lra else [])
    # results before the baselines were grouped kept the majority class on its own
    baselines = data.get("baselines") or {"majority_accuracy": data["majority_accuracy"]}
    named = {
        "majority_accuracy": "Always answering the most common class scores {test:.1f}% on "
        "the test split and {valid:.1f}% on the validation split.",
        "first_token_accuracy": "Answering the class most common in training after the "
        "first token (the root operator) scores {test:.1f}% on test and {valid:.1f}% on "
        "validation.",
        "naive_bayes_accuracy": "A naive Bayes classifier of character 4-grams, which "
        "reads the whole text without attention or training steps, scores {test:.1f}% on "
        "test and {valid:.1f}% on validation.",
        "unigram_bpc": "The training text's character frequencies, reading no context, "
        "score {test:.2f} bits per character on test and {valid:.2f} on validation.",
    }
    said_baselines = " ".join(named[key].format(**value) for key, value in baselines.items())
    seeds = ", ".join(map(str, sorted(next(iter(data["kernels"].values()))["seeds"])))
    device = data.get("gpu", data["args"].get("device", ""))
    task = data.get("task", "listops")
    if task == "charlm":
        about = "the English Bible (WEB), one piece per character, blocks of 2,048."
    else:
        sizes = data["data"]["sizes"]
        what, unit = (
            (f"ListOps at scale {data['data']['settings']['scale']:g}", "expressions")
            if task == "listops"
            else (f"the Bible's {len(data['data']['classes'])} genres", "passages, by chapter")
        )
        about = (
            f"{what}: {sizes['train']:,} / {sizes['valid']:,} / {sizes['test']:,} train / "
            f"valid / test {unit}, mean {data['mean_train_tokens']:,.0f} tokens."
        )
    said = (
        f"{len(data['runs'])} runs, seeds {seeds} per kernel, "
        f"{min(int(data['args']['parallel']), len(data['runs']))} at a time on one {device}; "
        f"{about} {said_baselines}"
    )
    return "\n\n".join([table(headers, rows, left=1), said, source(name, data)])


TABLES: dict[str, Callable[[], str]] = {
    "goals": goals,
    "train": train,
    "train-compile": train_compile,
    "decode": decode,
    "decode-latency": decode_latency,
    "decode-vs-2d41774": decode_vs_commit,
    "decode-cells": decode_cells,
    "decode-fair-cells": lambda: decode_cells("decode-fair"),
    "decode-memory": decode_memory,
    "kernels": kernels,
    "attention": attention,
    "sliding-window": sliding_window,
    "efficient-attention": efficient_attention,
    "gpu-attention": lambda: attention("attention-gpu"),
    "gpu-sliding-window": lambda: sliding_window("attention-gpu"),
    "gpu-efficient-attention": lambda: efficient_attention("attention-gpu"),
    "gpu-sdpa-backends": sdpa_backends,
    "gpu-train": gpu_train,
    "translate": translate_file,
    "serve-continuous": lambda: serve("serve-continuous"),
    "serve-dynamic": lambda: serve("serve-dynamic"),
    "serve-continuous-rows": lambda: serve("serve-continuous-rows"),
    "serve-continuous-groups": lambda: serve("serve-continuous-groups"),
    "generate-engine": generate_engine,
    "step-overhead": step_overhead,
    "gpu-decode": gpu_decode,
    "efficient-listops": lambda: efficient_task("efficient-listops"),
    "efficient-bible-genre": lambda: efficient_task("efficient-bible-genre"),
    "efficient-charlm": lambda: efficient_task("efficient-charlm"),
    "positions-extrapolation": positions_extrapolation,
    "positions-bible": positions_bible,
    "pruning": pruning,
    "serve": lambda: serve("serve"),
    "serve-greedy": lambda: serve("serve-greedy"),
    "serve-wait50": lambda: serve("serve-wait50"),
    "shapes": shapes,
    "generate": lambda: generate("generate"),
    "generate-1thread": lambda: generate("generate-1thread"),
    "quickstart": quickstart,
    "train-profile": train_profile,
    "quality": quality,
    "quality-seeds": quality_seeds,
    "valid-variants": valid_variants,
    "valid-searches": valid_searches,
    "induction": induction,
    "alignment": alignment,
    "export": export,
    "hooks": hooks,
    "memory": memory,
    "int8-kernels": int8_kernels,
    "train-profile-bf16": lambda: train_profile("train-profile-bf16"),
}


# ----- README.md and docs/ -------------------------------------------------------------


def recorded(name: str) -> Callable[[], bool]:
    """Whether RESULTS/NAME.json exists, asked when the tables are rendered."""
    return lambda: (RESULTS / f"{name}.json").exists()


# Tables rendered only once their results exist (README gains their blocks with them).
WHEN = {
    "decode-cells": has_cells,
    "decode-fair-cells": lambda: has_cells("decode-fair"),
    "decode-memory": has_cells,
    "quickstart": has_quickstart_runs,
    "train-profile": recorded("train-profile"),
    "quality": recorded("quality"),
    "quality-seeds": recorded("quality-seeds"),
    "valid-variants": recorded("valid-sweep"),
    "valid-searches": recorded("valid-sweep"),
    "induction": recorded("induction"),
    "alignment": recorded("alignment"),
    "export": recorded("export"),
    "hooks": recorded("hooks"),
    "memory": recorded("memory"),
    "int8-kernels": recorded("int8-kernels"),
    "efficient-attention": lambda: "efficient" in load("attention"),
    "train-profile-bf16": recorded("train-profile-bf16"),
    "gpu-attention": recorded("attention-gpu"),
    "gpu-sliding-window": recorded("attention-gpu"),
    "gpu-efficient-attention": recorded("attention-gpu"),
    "gpu-sdpa-backends": recorded("attention-gpu"),
    "gpu-train": recorded("train-gpu-big"),
    "translate": recorded("translate"),
    "serve-continuous": recorded("serve-continuous"),
    "serve-dynamic": recorded("serve-dynamic"),
    "serve-continuous-rows": recorded("serve-continuous-rows"),
    "serve-continuous-groups": recorded("serve-continuous-groups"),
    "generate-engine": recorded("generate-engine"),
    "step-overhead": recorded("step-overhead"),
    "gpu-decode": recorded("decode-gpu-b256"),
    "efficient-listops": recorded("efficient-listops"),
    "efficient-bible-genre": recorded("efficient-bible-genre"),
    "efficient-charlm": recorded("efficient-charlm"),
}


def render_all() -> dict[str, str]:
    return {name: render() for name, render in TABLES.items() if name not in WHEN or WHEN[name]()}


def documents() -> list[Path]:
    """The files whose blocks are rendered: README.md and every docs page."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def document_name(path: Path) -> str:
    """A document's path as messages name it (relative to the repository)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def blocks(text: str) -> dict[str, str]:
    """A document's rendered blocks: marker name -> the text between the markers."""
    return {m.group(1): m.group(2) for m in BLOCK.finditer(text)}


def stale(texts: dict[str, str], rendered: dict[str, str]) -> list[str]:
    """Each problem with the documents' blocks, one line each (empty: all up to date).

    Args:
        texts: each document's name (README.md, docs/...) and its text.
        rendered: each table's name and its rendering (`render_all`).

    Returns:
        A table that no document holds; per document, a block that names no table, or
        one that differs from its rendering.
    """
    found = {name: blocks(text) for name, text in texts.items()}
    held = {table for tables in found.values() for table in tables}
    problems = [
        f"{table}: no <!-- report:{table} --> block in README.md or docs/"
        for table in rendered
        if table not in held
    ]
    for name, tables in found.items():
        problems += [
            f"{name}: {table}: no such table in report.py"
            for table in tables
            if table not in rendered
        ]
        problems += [
            f"{name}: {table}: differs from what report.py renders from the results files"
            for table in rendered
            if table in tables and tables[table] != rendered[table] + "\n"
        ]
    return problems


def updated(text: str, rendered: dict[str, str]) -> str:
    """`text` with every block replaced by its rendering."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in rendered:
            return match.group(0)
        return f"<!-- report:{name} -->\n{rendered[name]}\n<!-- /report:{name} -->"

    return BLOCK.sub(replace, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--write", action="store_true", help="update the blocks of README.md and docs/**/*.md"
    )
    action.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    args = parser.parse_args()
    try:
        rendered = render_all()
    except (OSError, KeyError, ValueError) as err:  # a results file missing or malformed
        sys.exit(f"report.py: cannot render from {RESULTS}: {type(err).__name__}: {err}")
    paths = {document_name(path): path for path in documents()}
    texts = {name: path.read_text(encoding="utf-8") for name, path in paths.items()}
    if args.check:
        problems = stale(texts, rendered)
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run `python -m benchmarks.report --write`", file=sys.stderr)
            sys.exit(1)
        print("the measured tables of README.md and docs/ match benchmarks/results/")
    elif args.write:
        written = 0
        for name, text in texts.items():
            new = updated(text, rendered)
            written += len(set(blocks(new)) & set(rendered))
            if new != text:
                paths[name].write_text(new, encoding="utf-8")
        print(f"{written} tables written into README.md and docs/")
        held = {table for text in texts.values() for table in blocks(text)}
        for name in rendered:
            if name not in held:
                print(
                    f"no document has a block for {name}: add <!-- report:{name} --> ... "
                    f"<!-- /report:{name} --> to README.md or a docs page"
                )
    else:
        for name, text in rendered.items():
            print(f"<!-- report:{name} -->\n{text}\n<!-- /report:{name} -->\n")


if __name__ == "__main__":
    main()
