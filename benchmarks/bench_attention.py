"""One attention layer: time and peak memory of SDPA, the explicit path and the efficient kernels.

    python -m benchmarks.bench_attention [--quick] [--only attend|sliding|efficient]

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

`efficient`: every registered kind of attention built as a model builds it (d_model
256, 4 heads of 64, batch 1, a padding mask): sdpa, sliding_window, bigbird, linear
and performer, forward + backward (bidirectional) at L = 1k ... 64k, time and peak
memory, taking turns; a kernel whose time, grown quadratically from the previous
length, would pass --max-seconds is skipped. Then, for the kernels with a causal form,
one decoding step at position 1k and 16k (the store filled first): its time and the
memory its store holds (keys and values, or a recurrent state). The first length at
which each kernel's training pass beats SDPA's is printed and saved ("crossover").

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


# ----- efficient kernels -------------------------------------------------------------

# (kernel, its attention_options): each one built through the registry, as a model would
EFFICIENT_KERNELS = ("sdpa", "sliding_window", "bigbird", "linear", "performer")
CAUSAL_KERNELS = ("sdpa", "sliding_window", "linear", "performer")  # bigbird has no causal form
EFFICIENT_D_MODEL, EFFICIENT_HEADS = 256, 4


def efficient_kernel(name: str, args):
    """The registered kernel `name` of a d_model 256, 4-head model, with this run's options."""
    from aiayn.config import ModelConfig
    from aiayn.nn.kernels import build_kernel

    options = {
        "performer": {"num_features": args.num_features},
        "bigbird": {"block_size": args.block_size, "num_random_blocks": args.random_blocks},
    }.get(name, {})
    cfg = ModelConfig(
        vocab_size=8,
        d_model=EFFICIENT_D_MODEL,
        n_heads=EFFICIENT_HEADS,
        attention=name,
        attention_options=options,
        attention_window=args.window,
        global_tokens=args.n_global,
    )
    kernel = build_kernel(cfg)
    return kernel.eval() if hasattr(kernel, "eval") else kernel  # no redraws while timed


def store_bytes(store) -> int:
    """Memory a decoding store holds: the distinct storages of its tensors (a growing
    `LayerKV` keeps buffers with room to grow; a recurrent state its sums)."""
    import torch

    seen, total = set(), 0
    for value in vars(store).values():
        tensors = value if isinstance(value, list | tuple) else [value]
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    total += storage.nbytes()
    return total


def measure_efficient(device: str, length: int, args, estimates: dict) -> dict:
    """Forward + backward time and its peak memory of each kernel, bidirectional, with a
    padding mask; a kernel whose expected time passes --max-seconds is skipped."""
    import torch

    generator = torch.Generator().manual_seed(0)
    head = EFFICIENT_D_MODEL // EFFICIENT_HEADS
    shape = (1, EFFICIENT_HEADS, length, head)
    q, k, v = (torch.randn(shape, generator=generator).to(device) for _ in range(3))
    mask = torch.ones(1, 1, 1, length, dtype=torch.bool, device=device)
    mask[..., length - length // 8 :] = False  # some padding
    kernels = {name: efficient_kernel(name, args) for name in EFFICIENT_KERNELS}
    for kernel in kernels.values():
        if hasattr(kernel, "to"):
            kernel.to(device)
    trainable = [t.clone().requires_grad_() for t in (q, k, v)]

    def train(name):
        out, _ = kernels[name](*trainable, mask)
        out.sum().backward()
        for t in trainable:
            t.grad = None

    record, skipped, runs = dict(device=device, length=length), {}, []
    for name in EFFICIENT_KERNELS:
        expected = estimates.get(name)
        if expected is not None and expected > args.max_seconds:
            skipped[name] = f"~{expected:.0f} s a call expected > --max-seconds"
        else:
            runs.append(name)
    times = {name: [] for name in runs}
    for _ in range(args.repeats + 1):  # the first round warms up
        for name in runs:
            start = time.perf_counter()
            train(name)
            if device == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    for name in EFFICIENT_KERNELS:
        ran = name in times
        record[f"{name}_train_ms"] = 1000 * common.median(times[name][1:]) if ran else None
        peak = peak_bytes(device, lambda n=name: train(n)) if ran else None
        record[f"{name}_train_peak_mib"] = None if peak is None else peak / 2**20
    record["skipped"] = skipped
    return record


def measure_decoding(device: str, position: int, args) -> dict:
    """One causal decoding step at `position` (batch 1): its time and the memory of the
    store it reads, for each causal kernel. The store is filled a chunk at a time."""
    import torch

    from aiayn.inference.kv_cache import self_attention_store

    head = EFFICIENT_D_MODEL // EFFICIENT_HEADS
    generator = torch.Generator().manual_seed(0)

    def random(length):
        shape = (1, EFFICIENT_HEADS, length, head)
        return [torch.randn(shape, generator=generator).to(device) for _ in range(3)]

    record = dict(device=device, position=position)
    with torch.inference_mode():
        for name in CAUSAL_KERNELS:
            kernel = efficient_kernel(name, args)
            if hasattr(kernel, "to"):
                kernel.to(device)
            store = self_attention_store(kernel)
            for start in range(0, position, 1024):
                q, k, v = random(min(1024, position - start))
                kernel.attend_cached(q, k, v, store, causal=True)
            steps = [random(1) for _ in range(args.repeats + 1)]
            times = []
            for q, k, v in steps:
                begin = time.perf_counter()
                kernel.attend_cached(q, k, v, store, causal=True)
                if device == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - begin)
            record[f"{name}_step_ms"] = 1000 * common.median(times[1:])
            record[f"{name}_cache_mib"] = store_bytes(store) / 2**20
    return record


def crossovers(records: list[dict]) -> dict[str, int | None]:
    """Per kernel, the shortest length from which its forward + backward beats SDPA's
    (None: not within the lengths run, or SDPA skipped before it)."""
    found = {}
    for name in EFFICIENT_KERNELS[1:]:
        found[name] = None
        for record in sorted(records, key=lambda r: r["length"]):
            mine, sdpa = record[f"{name}_train_ms"], record["sdpa_train_ms"]
            if mine is not None and (sdpa is None or mine < sdpa):
                found[name] = record["length"]
                break
    return found


def efficient_table(args, devices: list[str]) -> tuple[dict, str]:
    """Run the efficient-kernels tables (training pass by length, decoding step by
    position); return their records and markdown."""
    records, decoding, rows, decode_rows = [], [], [], []
    for device in devices:
        estimates: dict = {}
        for i, length in enumerate(args.efficient_lengths):
            record = measure_efficient(device, length, args, estimates)
            records.append(record)
            following = args.efficient_lengths[i + 1 : i + 2]
            growth = (following[0] / length) ** 2 if following else 0.0  # quadratic: safe side
            for name in EFFICIENT_KERNELS:
                measured = record[f"{name}_train_ms"]
                if measured is not None:
                    estimates[name] = measured / 1000 * growth
                elif name in estimates:
                    estimates[name] *= growth
            rows.append(
                [device, length]
                + [
                    "skipped" if record[key] is None else record[key]
                    for name in EFFICIENT_KERNELS
                    for key in (f"{name}_train_ms", f"{name}_train_peak_mib")
                ]
            )
            for name, reason in record["skipped"].items():
                print(f"{device} {length}: {name} skipped: {reason}", file=sys.stderr)
        for position in args.decode_positions:
            record = measure_decoding(device, position, args)
            decoding.append(record)
            decode_rows.append(
                [device, position]
                + [
                    record[f"{name}_{key}"]
                    for name in CAUSAL_KERNELS
                    for key in ("step_ms", "cache_mib")
                ]
            )
    found = {
        device: crossovers([r for r in records if r["device"] == device]) for device in devices
    }
    headers = ["device", "length"]
    for name in EFFICIENT_KERNELS:
        headers += [f"{name} fwd+bwd ms", f"{name} peak MiB"]
    decode_headers = ["device", "position"]
    for name in CAUSAL_KERNELS:
        decode_headers += [f"{name} step ms", f"{name} cache MiB"]
    crossing = "; ".join(
        f"{device}: " + ", ".join(f"{name} {length or 'none'}" for name, length in kernels.items())
        for device, kernels in found.items()
    )
    markdown = (
        common.table(headers, rows)
        + "\n\nFirst length at which a kernel's fwd+bwd beats SDPA's: "
        + crossing
        + "\n\n"
        + common.table(decode_headers, decode_rows)
    )
    return dict(results=records, decoding=decoding, crossover=found), markdown


def previous_results(name: str = "attention") -> dict:
    """The saved results/NAME.json ({} if none), to keep the table not run now."""
    path = common.RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


# ----- SDPA's CUDA backends ----------------------------------------------------------

BACKENDS = ("flash", "efficient", "math")


def measure_backends(length: int, args) -> dict:
    """Causal self-attention through each of SDPA's CUDA backends, forced one at a time
    (`torch.nn.attention.sdpa_kernel`): bf16 (batch 1, HEADS heads of HEAD_SIZE), forward
    + backward time and its peak memory. The math backend (the (L, L) scores in
    memory) is skipped when its scores, forward and backward, would pass --max-gib.
    A backend PyTorch refuses at this shape is recorded with its reason."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kinds = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    generator = torch.Generator().manual_seed(0)
    shape = (1, HEADS, length, HEAD_SIZE)
    q, k, v = (
        torch.randn(shape, generator=generator).to("cuda", torch.bfloat16).requires_grad_()
        for _ in range(3)
    )
    record, skipped = dict(device="cuda", length=length), {}
    for name, kind in kinds.items():
        record[f"{name}_train_ms"] = record[f"{name}_peak_mib"] = None
        scores_gib = 3 * HEADS * length * length * 4 / 2**30  # fp32 scores, weights, grads
        if name == "math" and scores_gib > args.max_gib:
            skipped[name] = f"its (L, L) scores would take ~{scores_gib:.0f} GiB > --max-gib"
            continue

        def call(kind=kind):
            with sdpa_kernel([kind]):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            for t in (q, k, v):
                t.grad = None

        try:
            call()
        except RuntimeError as err:  # this backend does not take this shape or card
            skipped[name] = str(err).splitlines()[0][:200]
            continue
        torch.cuda.synchronize()
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            call()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        record[f"{name}_train_ms"] = 1000 * common.median(times)
        record[f"{name}_peak_mib"] = peak_bytes("cuda", call) / 2**20
    record["skipped"] = skipped
    return record


def backends_table(args) -> tuple[list[dict], str]:
    """`measure_backends` at each of --backend-lengths, and its table."""
    records = [measure_backends(length, args) for length in args.backend_lengths]
    rows = []
    for r in records:
        row = [f"{r['length']:,}"]
        for name in BACKENDS:
            ms, mib = r[f"{name}_train_ms"], r[f"{name}_peak_mib"]
            row += ["—" if ms is None else f"{ms:.2f}", "—" if mib is None else f"{mib:,.0f}"]
        rows.append(row)
    headers = ["L"] + [f"{n} {what}" for n in BACKENDS for what in ("ms", "MiB")]
    return records, common.table(headers, rows)


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
    parser.add_argument("--efficient-lengths", default="1024,4096,16384,65536")
    parser.add_argument("--decode-positions", default="1024,16384")
    parser.add_argument("--num-features", type=int, default=256, help="performer's m")
    parser.add_argument("--block-size", type=int, default=64, help="bigbird's block")
    parser.add_argument("--random-blocks", type=int, default=3, help="bigbird's r")
    parser.add_argument(
        "--backend-lengths",
        default="4096,16384,65536",
        help="backends (CUDA only): lengths",
    )
    parser.add_argument(
        "--only",
        choices=("attend", "sliding", "efficient", "backends"),
        help="one table; the others' saved rows stay (backends: on CUDA, and only if named)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="measure on this device only (default: the CPU, and CUDA where there is one)",
    )
    parser.add_argument(
        "--results",
        default="attention",
        help="results file name, merged into (default: attention; a GPU run: attention-gpu)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="lengths up to 2048 (sliding 16384, efficient 4096, decoding 1024), 3 repeats",
    )
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    args.sliding_lengths = sorted(int(n) for n in args.sliding_lengths.split(","))
    args.efficient_lengths = sorted(int(n) for n in args.efficient_lengths.split(","))
    args.decode_positions = sorted(int(n) for n in args.decode_positions.split(","))
    args.backend_lengths = sorted(int(n) for n in args.backend_lengths.split(","))
    if args.quick:
        lengths, args.repeats = [n for n in lengths if n <= 2048], 3
        args.sliding_lengths = [n for n in args.sliding_lengths if n <= 16384]
        args.efficient_lengths = [n for n in args.efficient_lengths if n <= 4096]
        args.decode_positions = [n for n in args.decode_positions if n <= 1024]
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if args.device is not None:
        if args.device == "cuda" and not torch.cuda.is_available():
            sys.exit("bench_attention: --device cuda, but PyTorch sees no CUDA device here")
        devices = [args.device]
    if args.only == "backends" and not torch.cuda.is_available():
        sys.exit("bench_attention: --only backends measures SDPA's CUDA backends: no CUDA here")
    where = common.machine() + (f"; {torch.cuda.get_device_name()}" if "cuda" in devices else "")
    saved_args = {k: str(v) for k, v in vars(args).items()}
    payload = previous_results(args.results)
    if args.only in (None, "attend"):
        records, table = attend_table(args, lengths, devices)
        print(
            f"\nOne attention call, batch 1, 8 heads of 64, padding mask, inference, "
            f"{args.threads} threads, median of {args.repeats}; {where}\n"
        )
        print(table)
        for stale in common.provenance():  # write_json records the new rows' own
            payload.pop(stale, None)
        payload.update(args=saved_args, results=records)
    if args.only in (None, "sliding"):
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
            **common.provenance(args.threads),
            "args": saved_args,
            "results": records,
        }
    if args.only in (None, "efficient"):
        common.set_threads(args.threads)
        found, table = efficient_table(args, devices)
        print(
            f"\nEfficient kernels, one attention layer (d_model {EFFICIENT_D_MODEL}, "
            f"{EFFICIENT_HEADS} heads), batch 1, padding mask, bidirectional forward + backward; "
            f"then one causal decoding step at a position, with its store's memory; sliding "
            f"window {args.window} + {args.n_global} global, bigbird blocks of "
            f"{args.block_size} with {args.random_blocks} random, performer "
            f"{args.num_features} features; {args.threads} threads, median of {args.repeats}; "
            f"{where}\n"
        )
        print(table)
        payload["efficient"] = {**common.provenance(args.threads), "args": saved_args, **found}
    if args.only == "backends":
        records, table = backends_table(args)
        print(
            f"\nSDPA's CUDA backends, each forced: causal self-attention, bf16, batch 1, "
            f"{HEADS} heads of {HEAD_SIZE}, forward + backward, median of {args.repeats}; "
            f"peak = one call's; {where}\n"
        )
        print(table)
        payload["backends"] = {**common.provenance(), "args": saved_args, "results": records}
    if args.only in (None, "attend"):
        path = common.write_json(args.results, payload)
    else:  # the top level is the attend table's provenance: it stays as it was measured
        path = common.RESULTS / f"{args.results}.json"
        path.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
