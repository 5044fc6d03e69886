"""One attention layer: time and peak memory of the SDPA path vs the explicit path.

    PYTHONPATH=src python benchmarks/bench_attention.py [--quick]

`aiayn.attention.attend` on (batch 1, 8 heads, L, 64) queries, keys and values with
a padding mask, forward only (inference), at L = 128 ... 8192, on the CPU and on
CUDA when there is one. The explicit path materialises the (L, L) weights; SDPA
does not (flash / memory-efficient kernels). CPU peak memory is measured with
torch's profiler (allocations made during the call); CUDA's with
`max_memory_allocated`. A length whose explicit path would exceed --max-gib is
skipped and shown as such.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common


def peak_cpu_bytes(fn) -> int:
    """Largest live total of the allocations `fn` makes (profiler memory events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live, peak = 0, 0
    events = sorted(
        (e for e in prof.events() if e.self_cpu_memory_usage),
        key=lambda e: e.time_range.start,
    )
    for event in events:
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def measure(device: str, length: int, need_weights: bool, repeats: int, threads: int):
    import torch

    from aiayn.attention import attend

    common.set_threads(threads)
    generator = torch.Generator().manual_seed(0)
    shape = (1, 8, length, 64)
    q, k, v = (torch.randn(shape, generator=generator).to(device) for _ in range(3))
    mask = torch.ones(1, 1, 1, length, dtype=torch.bool, device=device)
    mask[..., length - length // 8 :] = False  # some padding

    def call():
        with torch.inference_mode():
            return attend(q, k, v, mask, need_weights=need_weights)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    call()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        call()
        sync()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = peak_cpu_bytes(call)
    return common.median(times), peak


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="128,256,512,1024,2048,4096,8192")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-gib", type=float, default=2.0, help="skip bigger explicit runs")
    parser.add_argument("--quick", action="store_true", help="lengths up to 2048, 3 repeats")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.quick:
        lengths, args.repeats = [n for n in lengths if n <= 2048], 3
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows, records = [], []
    for device in devices:
        for length in lengths:
            result = {}
            for path, need_weights in (("sdpa", False), ("explicit", True)):
                weights_bytes = 2 * 8 * length * length * 4  # scores and weights, fp32
                if need_weights and weights_bytes > args.max_gib * 2**30:
                    result[path] = None
                    continue
                result[path] = measure(device, length, need_weights, args.repeats, args.threads)
            sdpa, explicit = result["sdpa"], result["explicit"]
            record = dict(
                device=device,
                length=length,
                sdpa_ms=1000 * sdpa[0],
                sdpa_peak_mib=sdpa[1] / 2**20,
                explicit_ms=None if explicit is None else 1000 * explicit[0],
                explicit_peak_mib=None if explicit is None else explicit[1] / 2**20,
            )
            records.append(record)
            rows.append(
                [
                    device,
                    length,
                    record["sdpa_ms"],
                    record["sdpa_peak_mib"],
                    "skipped" if explicit is None else record["explicit_ms"],
                    "skipped" if explicit is None else record["explicit_peak_mib"],
                    "" if explicit is None else f"{explicit[0] / sdpa[0]:.1f}x",
                ]
            )
    where = common.machine() + (
        f"; {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    )
    print(
        f"\nOne attention call, batch 1, 8 heads of 64, padding mask, inference, "
        f"{args.threads} threads, median of {args.repeats}; {where}\n"
    )
    print(
        common.table(
            [
                "device",
                "length",
                "SDPA ms",
                "SDPA peak MiB",
                "explicit ms",
                "explicit peak MiB",
                "explicit / SDPA time",
            ],
            rows,
        )
    )
    path = common.write_json(
        "attention", {"args": {k: str(v) for k, v in vars(args).items()}, "results": records}
    )
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
