"""One attention layer: time and peak memory of SDPA, the explicit path and a sliding window.

    python -m benchmarks.bench_attention [--quick] [--only attend|sliding]

Two tables, on the CPU and on CUDA when there is one, forward only (inference)
unless said otherwise.

`attend`: `aiayn.nn.attention.attend` on (batch 1, 8 heads, L, 64) queries, keys and
values with a padding mask, at L = 128 ... 8192. The explicit path materialises the
(L, L) weights; SDPA does not (flash / memory-efficient kernels). A length whose
explicit path would exceed --max-gib is skipped and shown as such.

`sliding`: `aiayn.nn.kernels.sliding_window.sliding_window_attention` (window --window on each
side, --n-global global tokens, the same padding mask) at L = 1k ... 64k, against
dense SDPA with the equivalent (L, L) band mask (built inside the call: it is part of
that method's cost) and against full SDPA with no mask at all (the fused kernel at its
fastest, attending every key). The systems take turns, one call each, so that they
see the same machine load. Forward and forward + backward times; the peak is the
forward's. A dense row is skipped when its mask would exceed --max-gib or when the
previous length's time, grown quadratically, says it would take over --max-seconds.

CPU peak memory is measured with torch's profiler (allocations made during the
call); CUDA's with `max_memory_allocated`. Results are merged into
results/attention.json: a run of one table keeps the other's rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from benchmarks import common


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

    from aiayn.nn.attention import attend

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
    return common.median(times), peak_bytes(device, call)


def peak_bytes(device: str, call: Callable[[], object]) -> int:
    """Peak memory `call` allocates: the profiler's on the CPU, CUDA's allocator statistics."""
    import torch

    if device != "cuda":
        return peak_cpu_bytes(call)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


# ----- sliding window ----------------------------------------------------------------

SLIDING_SYSTEMS = ("sliding", "band", "full")  # sliding window, dense band mask, full SDPA
HEADS, HEAD_SIZE = 8, 64


def sliding_calls(key_mask, window: int, n_global: int) -> dict[str, Callable]:
    """Each system's attention, a function of (q, k, v), over a (1, L) key mask."""
    import torch.nn.functional as F

    from aiayn.nn.kernels.sliding_window import band_mask, sliding_window_attention

    def sliding(q, k, v):
        return sliding_window_attention(q, k, v, window, key_mask=key_mask, n_global=n_global)

    def band(q, k, v):  # every row sees the global tokens: no row without a key
        length = q.size(2)
        mask = band_mask(length, length, window, n_global=n_global, device=q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask & key_mask[:, None, None])

    def full(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    return {"sliding": sliding, "band": band, "full": full}


def measure_sliding(device: str, length: int, args, estimates: dict) -> dict:
    """Forward and forward + backward times and forward peaks of the three systems.

    `estimates` maps (system, pass) to the seconds expected at this length, where
    known; a dense system whose estimate passes --max-seconds is skipped. Returns a
    record with None, and a reason under "skipped", for what was skipped.
    """
    import torch

    generator = torch.Generator().manual_seed(0)
    shape = (1, HEADS, length, HEAD_SIZE)
    q, k, v = (torch.randn(shape, generator=generator).to(device) for _ in range(3))
    key_mask = torch.ones(1, length, dtype=torch.bool, device=device)
    key_mask[:, length - length // 8 :] = False  # some padding
    calls = sliding_calls(key_mask, args.window, args.n_global)
    trainable = [t.clone().requires_grad_() for t in (q, k, v)]

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def forward(system):
        with torch.inference_mode():
            calls[system](q, k, v)

    def train(system):
        calls[system](*trainable).sum().backward()
        for t in trainable:
            t.grad = None

    record, skipped = dict(device=device, length=length), {}
    mask_gib = length * length / 2**30
    passes = {"ms": forward, "train_ms": train}
    labels = {"ms": "forward", "train_ms": "fwd+bwd"}
    runs = []
    for system in SLIDING_SYSTEMS:
        if system == "band" and mask_gib > args.max_gib:
            skipped[system] = f"its ({length}, {length}) mask is {mask_gib:.1f} GiB > --max-gib"
            continue
        for key in passes:
            expected = estimates.get((system, key))
            if system != "sliding" and expected is not None and expected > args.max_seconds:
                skipped[f"{system} {labels[key]}"] = (
                    f"~{expected:.0f} s a call expected (quadratic growth) > --max-seconds"
                )
                continue
            runs.append((system, key))
    times = {run: [] for run in runs}
    for _ in range(args.repeats + 1):  # the first round warms up
        for system, key in runs:
            start = time.perf_counter()
            passes[key](system)
            sync()
            times[system, key].append(time.perf_counter() - start)
    for system in SLIDING_SYSTEMS:
        for key in passes:
            seconds = common.median(times[system, key][1:]) if (system, key) in times else None
            record[f"{system}_{key}"] = None if seconds is None else 1000 * seconds
        ran = (system, "ms") in times
        peak = peak_bytes(device, lambda s=system: forward(s)) if ran else None
        record[f"{system}_peak_mib"] = None if peak is None else peak / 2**20
    record["skipped"] = skipped
    return record


def sliding_table(args, devices: list[str]) -> tuple[list[dict], str]:
    """Run the sliding-window table; return its records and its markdown."""
    records, rows = [], []
    keys = ("ms", "train_ms")
    for device in devices:
        estimates: dict = {}  # (system, key) -> seconds expected at the next length
        for i, length in enumerate(args.sliding_lengths):
            record = measure_sliding(device, length, args, estimates)
            records.append(record)
            following = args.sliding_lengths[i + 1 : i + 2]
            growth = (following[0] / length) ** 2 if following else 0.0
            for system, key in ((s, k) for s in SLIDING_SYSTEMS for k in keys):
                measured = record[f"{system}_{key}"]
                if measured is not None:
                    estimates[system, key] = measured / 1000 * growth
                elif (system, key) in estimates:  # skipped for time: still growing
                    estimates[system, key] *= growth
            rows.append(
                [device, length]
                + [
                    "skipped" if record[name] is None else record[name]
                    for system in SLIDING_SYSTEMS
                    for name in (f"{system}_ms", f"{system}_train_ms", f"{system}_peak_mib")
                ]
            )
            for system, reason in record["skipped"].items():
                print(f"{device} {length}: {system} skipped: {reason}", file=sys.stderr)
    headers = ["device", "length"]
    for name in ("sliding", "dense band", "full SDPA"):
        headers += [f"{name} ms", f"{name} fwd+bwd ms", f"{name} peak MiB"]
    return records, common.table(headers, rows)


def attend_table(args, lengths: list[int], devices: list[str]) -> tuple[list[dict], str]:
    """Run the `attend` table (SDPA against the explicit path); its records and markdown."""
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
    headers = ["device", "length", "SDPA ms", "SDPA peak MiB", "explicit ms"]
    headers += ["explicit peak MiB", "explicit / SDPA time"]
    return records, common.table(headers, rows)


def previous_results() -> dict:
    """The saved results/attention.json ({} if none), to keep the table not run now."""
    path = common.RESULTS / "attention.json"
    return json.loads(path.read_text()) if path.exists() else {}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="128,256,512,1024,2048,4096,8192")
    parser.add_argument("--sliding-lengths", default="1024,4096,16384,65536")
    parser.add_argument("--window", type=int, default=256, help="sliding: keys on each side")
    parser.add_argument("--n-global", type=int, default=16, help="sliding: global tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-gib", type=float, default=2.0, help="skip bigger dense runs")
    parser.add_argument(
        "--max-seconds", type=float, default=20.0, help="sliding table: skip slower dense calls"
    )
    parser.add_argument(
        "--only", choices=("attend", "sliding"), help="one table; the other's saved rows stay"
    )
    parser.add_argument(
        "--quick", action="store_true", help="lengths up to 2048 (sliding 16384), 3 repeats"
    )
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    args.sliding_lengths = sorted(int(n) for n in args.sliding_lengths.split(","))
    if args.quick:
        lengths, args.repeats = [n for n in lengths if n <= 2048], 3
        args.sliding_lengths = [n for n in args.sliding_lengths if n <= 16384]
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    where = common.machine() + (
        f"; {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    )
    saved_args = {k: str(v) for k, v in vars(args).items()}
    payload = previous_results()
    if args.only != "sliding":
        records, table = attend_table(args, lengths, devices)
        print(
            f"\nOne attention call, batch 1, 8 heads of 64, padding mask, inference, "
            f"{args.threads} threads, median of {args.repeats}; {where}\n"
        )
        print(table)
        for stale in common.provenance():  # write_json records the new rows' own
            payload.pop(stale, None)
        payload.update(args=saved_args, results=records)
    if args.only != "attend":
        common.set_threads(args.threads)
        records, table = sliding_table(args, devices)
        print(
            f"\nSliding window (window {args.window} each side, {args.n_global} global tokens) "
            f"vs dense SDPA with the band mask vs full SDPA (no mask); batch 1, "
            f"{HEADS} heads of {HEAD_SIZE}, padding mask, {args.threads} threads, median of "
            f"{args.repeats}; peak = forward; {where}\n"
        )
        print(table)
        payload["sliding_window"] = {
            **common.provenance(),
            "args": saved_args,
            "results": records,
        }
    path = common.write_json("attention", payload)
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
