"""The CPU inference page's quality and memory tables: each precision's BLEU against
fp32 (one run and several seeds), the int8 kernels and what a frozen model holds."""

from __future__ import annotations

from typing import Any

from benchmarks import report
from benchmarks.report import number, ratio, source, table
from benchmarks.report.runs import weights_label

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
    data = report.load("quality")
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
    data = report.load("quality-seeds")
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


def int8_kernels(name: str = "int8-kernels") -> str:
    """Each int8 candidate's speed against float32, per weight shape and row count."""
    data = report.load(name)
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
    return "\n\n".join([table(headers, rows), notes, source(name, data)])


def memory() -> str:
    """What a frozen model holds in memory, today against the commit before."""
    data = report.load("memory")
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
