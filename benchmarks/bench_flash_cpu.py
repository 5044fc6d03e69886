"""SDPA's flash path against its math path and the explicit softmax(QK^T)V, on the CPU.

    python -m benchmarks.bench_flash_cpu [--lengths 256,512,1024,2048,4096] [--rounds 5]

Three ways to compute one attention layer's softmax(Q K^T / sqrt(d)) V over (batch 1,
--heads heads, N, --head-size) float32 queries, keys and values, self-attention:

- `sdpa-flash`: `torch.nn.functional.scaled_dot_product_attention` held to its flash
  backend (`sdpa_kernel(SDPBackend.FLASH_ATTENTION)`): on the CPU,
  `aten::_scaled_dot_product_flash_attention_for_cpu`, blocks of queries and keys with
  an online softmax (the tiling of tutorial 12), never the N x N weights;
- `sdpa-math`: the same call held to its math backend (the formula in ATen operations);
- `explicit`: softmax(Q K^T / sqrt(d)) V written out in PyTorch, as tutorial 1 does.

For each N, with and without the causal mask: the forward alone (inference mode) and the
forward + backward (a training step's attention), each system in a worker process of its
own (benchmarks/common.py), the systems taking turns call by call after --warmup calls
each, the order turned every round. A time is the median of --rounds calls; `vs explicit`
is the median over rounds of the explicit call's time over the system's in the same
round. Each worker names the ATen operations its call ran and the vector ISA ATen
dispatched to. One thread by default: on a shared 2-core machine two OpenMP threads wait
for each other whenever another process takes a core.

Writes benchmarks/results/flash-cpu.json with the machine's provenance, its CPU flags,
`uptime` before and after the timed part, and the load average.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import time

from benchmarks import common

SYSTEMS = ("sdpa-flash", "sdpa-math", "explicit")
PASSES = ("forward", "forward+backward")
HEADERS = ["N", "mask", "pass", "system", "ms", "vs explicit"]


def uptime() -> str:
    """`uptime`'s line (the load average other work puts on the machine), or why not."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as err:
        return f"uptime failed: {err}"


def attention_call(system: str):
    """The system's attention, a function of (q, k, v, causal)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if system == "explicit":

        def explicit(q, k, v, causal):
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, N, N)
            if causal:
                n = q.size(-2)
                upper = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
                scores = scores.masked_fill(upper, float("-inf"))
            return scores.softmax(dim=-1) @ v

        return explicit
    backend = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-math": SDPBackend.MATH}[system]

    def sdpa(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return sdpa


def ran_ops(call) -> list[str]:
    """The attention operations `call` ran (SDPA's backend operation, or matmul and softmax)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    wanted = ("attention", "softmax", "matmul", "bmm")
    return sorted({e.name for e in prof.events() if any(w in e.name for w in wanted)})


def worker(system: str, threads: int, heads: int, head_size: int) -> None:
    import torch

    common.set_threads(threads)
    attention = attention_call(system)
    inputs: dict[int, tuple] = {}

    def handle(request):
        length, causal, training = request["length"], request["causal"], request["training"]
        if length not in inputs:
            inputs.clear()  # one length's tensors at a time
            generator = torch.Generator().manual_seed(0)
            shape = (1, heads, length, head_size)
            inputs[length] = tuple(torch.randn(shape, generator=generator) for _ in range(3))
        q, k, v = inputs[length]

        def forward():
            with torch.inference_mode():
                return attention(q, k, v, causal)

        def forward_backward():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            attention(*leaves, causal).sum().backward()

        call = forward_backward if training else forward
        start = time.perf_counter()
        call()
        seconds = time.perf_counter() - start
        reply = {"seconds": seconds}
        if request.get("describe"):  # once per cell, untimed
            reply["ops"] = ran_ops(call)
            reply["isa"] = torch.backends.cpu.get_cpu_capability()
        return reply

    common.serve(handle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="256,512,1024,2048,4096")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="N 256 and 512, 1 warm-up, 3 rounds")
    parser.add_argument("--name", default="flash-cpu", help="results file name")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.threads, args.heads, args.head_size)
    if args.quick:
        args.lengths, args.warmup, args.rounds = "256,512", 1, 3
    systems = args.systems.split(",")
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown --systems {','.join(unknown)}: choose from {','.join(SYSTEMS)}")
    lengths = [int(n) for n in args.lengths.split(",")]
    uptime_before = uptime()
    shape_args = ["--threads", str(args.threads), "--heads", str(args.heads)]
    shape_args += ["--head-size", str(args.head_size)]
    workers = {s: common.Worker(__spec__.name, s, shape_args, args.threads) for s in systems}
    records, rows = [], []
    try:
        for length in lengths:
            for causal in (False, True):
                for training in (False, True):
                    cell = dict(length=length, causal=causal, training=training)
                    described = {s: workers[s].ask(**cell, describe=True) for s in systems}
                    for _ in range(args.warmup - 1):
                        for s in systems:
                            workers[s].ask(**cell)
                    times = {s: [] for s in systems}
                    for r in range(args.rounds):
                        for s in systems[r % len(systems) :] + systems[: r % len(systems)]:
                            times[s].append(workers[s].ask(**cell)["seconds"])
                    for s in systems:
                        vs = None
                        if "explicit" in systems:
                            ratios = zip(times["explicit"], times[s], strict=True)
                            vs = common.median([a / b for a, b in ratios])
                        record = dict(
                            system=s,
                            length=length,
                            causal=causal,
                            **{"pass": PASSES[training]},
                            ms=1000 * common.median(times[s]),
                            times_ms=[round(1000 * t, 3) for t in times[s]],
                            vs_explicit=vs,
                            ops=described[s]["ops"],
                            isa=described[s]["isa"],
                        )
                        records.append(record)
                        rows.append(
                            [length, "causal" if causal else "full", PASSES[training], s,
                             record["ms"], "" if vs is None else f"{vs:.2f}x"]
                        )  # fmt: skip
                        print(common.table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
    finally:
        for w in workers.values():
            w.close()
    lengths_said = ", ".join(str(n) for n in lengths)
    measures = {
        "system": "SDPA's flash and math backends against the explicit softmax(QK^T)V",
        "cell": f"batch 1, {args.heads} heads of {args.head_size}, float32, N {lengths_said}, "
        f"{args.threads} thread(s), {common.machine()}",
        "harness": "bench_flash_cpu",
    }
    payload = {
        "measures": [measures],
        "args": {
            "lengths": lengths,
            "heads": args.heads,
            "head_size": args.head_size,
            "threads": args.threads,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "dtype": "float32",
            "batch": 1,
        },
        "uptime": {"before": uptime_before, "after": uptime()},
        "results": records,
    }
    path = common.write_json(args.name, payload)
    print(common.table(HEADERS, rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
