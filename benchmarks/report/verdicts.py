"""The goals table: each issue's speed goal against the measured ratios."""

from __future__ import annotations

from benchmarks import report
from benchmarks.report import per_round_ratio, span, table
from benchmarks.report.speed import TRAIN_FILES, decode_records, has_cells

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
        served = report.load(ENGINE_FILES["serve"])["cells"]
        for clients, goal in ((16, 5.0), (64, 8.0)):
            speedup = [
                c["speedup"]
                for c in served
                if c["clients"] == clients and c["server"] == "batching"
            ]
            work = f"serving, {clients} clients"
            rows.append([work, "continuous engine / one at a time", "fp32", speedup, goal])
    if ENGINE_FILES["translate"] in names:
        cells = report.load(ENGINE_FILES["translate"])["cells"]
        speedup = [c["speedup_vs_batches"] for c in cells if c["system"].startswith("continuous")]
        work = "translating a file, beam 8"
        rows.append([work, "continuous engine / batches", "fp32", speedup, 2.0])
    if ENGINE_FILES["generate"] in names:
        results = report.load(ENGINE_FILES["generate"])["results"]
        speedup = [
            r["speedup_vs_hf"]
            for r in results
            if r["size"] == "gpt2-small" and r["batch"] == 1 and r["system"].startswith("aiayn")
        ]
        work = "GPT-2 small generation, batch 1"
        rows.append([work, "aiayn / HF generate", "fp32", speedup, 1.5])
    if ENGINE_FILES["overhead"] in names:
        by = {
            (r["system"], r["slots"]): r for r in report.load(ENGINE_FILES["overhead"])["results"]
        }
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
    decode_data = report.load("decode")
    decode_rows = [r for r in decode_records(decode_data) if r["batch"] != 1]
    by = {(r["size"], r["search"], r["system"]): r for r in decode_rows}
    train_rows = [
        r
        for name in TRAIN_FILES
        if (report.RESULTS / f"{name}.json").exists()
        for r in report.load(name)["results"]
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
        cell_records = report.load("decode-fair")["cells"]
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
    engine_files = [
        name for name in ENGINE_FILES.values() if (report.RESULTS / f"{name}.json").exists()
    ]
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
        if (report.RESULTS / f"{name}.json").exists()
    )
    return table(headers, cells, left=3) + (
        f"\n\nComputed from {files}; their Source lines are under the tables they come "
        "from, on the Speed, CPU inference and decoding-engine pages."
    )
