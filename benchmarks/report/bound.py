"""The step's bound (bench_step_bound.py, issue 44 item 1): the bytes a decoding step must
read, this machine's copy bandwidth, the lower bound they put on a step, and each
system's step as a multiple of it."""

from __future__ import annotations

from benchmarks import report
from benchmarks.report import source, table

SYSTEMS = {
    "cache": "aiayn, cached step",
    "static": "aiayn, static step",
    "compiled": "aiayn, compiled step",
    "aoti": "aiayn, AOTInductor step",
    "ct2-fp32": "CTranslate2 fp32",
    "ct2-int8": "CTranslate2 int8",
}


def _ms(value: float) -> str:
    return f"{value:.2f}"


def _times(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def step_bound(name: str = "step-bound") -> str:
    """Per shape, precision and slot count: MB read, DRAM copy GB/s, the bound, whether
    the step's bytes fit in the last-level cache and the bound at the step's own size;
    then each system's step against both."""
    data = report.load(name)
    bounds = [
        [
            b["size"],
            b["precision"],
            str(b["slots"]),
            f"{b['bytes']['total'] / 1e6:.1f}",
            f"{b['dram_gb_s']:.1f}",
            _ms(b["bound_ms"]),
            {True: "yes", False: "no", None: ""}[b["fits_in_llc"]],
            _ms(b["at_size_bound_ms"]),
        ]
        for b in data["bounds"]
    ]
    headers = ["shape", "precision", "slots", "MB read", "DRAM GB/s", "bound ms"]
    headers += ["fits in LLC", "bound at its size, ms"]
    steps = [
        [
            s["size"],
            s["precision"],
            str(s["slots"]),
            SYSTEMS.get(s["system"], s["system"]),
            _ms(s["ms_per_step"]),
            _times(s["times_bound"]),
            _times(s["times_at_size_bound"]),
        ]
        for s in data["steps"]
    ]
    step_headers = ["shape", "precision", "slots", "system", "ms/step", "x bound"]
    step_headers += ["x bound at its size"]
    args = data["args"]
    llc = data.get("last_level_cache_bytes")
    said = (
        f"One greedy step at target position {args['position']} of {args['src_len']} source "
        "positions: the decoder's weights, the output projection, the float32 key/value "
        "caches and the embedding rows it reads (int8: every product's weight in int8 with "
        "a float32 scale per channel). Bandwidth: a STREAM copy of "
        f"{args['array_mib']} MiB arrays (DRAM), and of arrays of half the step's "
        "bytes (its own size"
        + (f", within a {llc >> 20} MiB last-level cache where it fits" if llc else "")
        + "). x bound: the step's time over the bound (1.00x: nothing but memory traffic)."
    )
    parts = [said, table(headers, bounds, left=3)]
    if steps:
        parts.append(table(step_headers, steps, left=4))
    return "\n\n".join([*parts, source(name, data, needs_quiet=True)])
