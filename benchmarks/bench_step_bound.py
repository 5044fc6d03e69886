"""The bound memory traffic puts on one decoding step: the bytes it must read over this
machine's memory bandwidth, and every system's step against it (issue 44, item 1).

    python -m benchmarks.bench_step_bound [--quick] [--threads 1,2] \
        [--steps step-small-fp32,step-small-int8,step-base-fp32,step-base-int8]

One greedy step of a post-norm encoder-decoder (`common.SHAPES`: `small`, `base`; the
vocabulary `common.VOCAB`) must read at least (`step_bytes`):

- the decoder's weights, once per step whatever the batch: per layer the stacked
  self-attention W^Q, W^K, W^V and its W^O, cross-attention's W^Q and W^O (its W^K, W^V
  are not read: the source's keys and values are computed once, before the first step),
  the feed-forward's two matrices, their biases and the three layer norms;
- the output projection, V x D and its bias (its own entry: the largest product);
- the key/value caches at the step's position t: self-attention's keys and values of
  positions 0..t for every row, and cross-attention's of the S source positions for
  every sentence (float32 in every system measured: aiayn and CTranslate2 keep float
  caches in int8 too);
- the rows of the token and position embeddings the step looks up.

In int8 (every product in int8, as `freeze(model, torch.int8, int8_output=True,
int8_min_elements=0)` and CTranslate2's int8 run) a weight is one byte, plus one float32
scale per output channel; biases, norms and caches stay float32. The activations between
products are left out (a few rows of D floats, in the caches of the core).

Bandwidth: a STREAM-style copy (`b.copy_(a)` of float32 tensors, torch's parallel copy at
the thread count asked for), counted as STREAM counts it: 2 x the array's bytes per copy
(read a, write b; the write-allocate read of b is not counted), best of `--repeats`. The
DRAM figure copies arrays of `--array-mib` each, far beyond the last-level cache. A step
whose bytes fit in the last-level cache can run faster than the DRAM bound, so a second
figure copies arrays of half the step's bytes each (footprint = the step's bytes): the
bandwidth at the step's own size, and the bound it gives.

The steps: bench_static_step results files (`--steps`, one per shape and precision, with
`--marian` so that CTranslate2 runs the same weights), each system's median step divided
by the bound at its slot count ("x bound": 1.0 would be a step that only reads memory).
The quiet run's commands are in `QUIET_RUN`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks import common

FLOAT32 = 4
QUIET_RUN = """\
for size in small base; do for dtype in fp32 int8; do
  python -m benchmarks.bench_static_step --marian --size $size --dtype $dtype --slots 1,32 \\
      --systems cache,static,compiled,aoti,ct2-$dtype --results step-$size-$dtype
done; done
python -m benchmarks.bench_step_bound --threads 1 \\
    --steps step-small-fp32,step-small-int8,step-base-fp32,step-base-int8"""


def step_bytes(
    d_model: int,
    d_ff: int,
    layers: int,
    vocab: int,
    precision: str,
    rows: int,
    position: int,
    src_len: int,
    sentences: int | None = None,
) -> dict[str, int]:
    """The bytes one decoding step must read (see the module), by part.

    Args:
        d_model, d_ff, layers, vocab: the decoder's shape (Marian: tied output, no final
            norm; the output projection has a bias).
        precision: "fp32" or "int8" (every product's weight in int8 with a float32
            scale per output channel).
        rows: the rows (hypotheses) the step decodes.
        position: the step's target position t (0 for the first step): the
            self-attention cache holds t + 1 positions once the step's own is written.
        src_len: S, source positions per sentence.
        sentences: source rows whose cross-attention caches are read (beam search's
            hypotheses of one sentence share them); None: `rows`.

    Returns:
        {"weights", "output", "self_cache", "cross_cache", "embeddings", "total"}.

    Raises:
        ValueError: a precision other than fp32 or int8.
    """
    if precision not in ("fp32", "int8"):
        raise ValueError(f"precision must be fp32 or int8, got {precision!r}")
    d, f = d_model, d_ff
    sentences = rows if sentences is None else sentences

    def product(out: int, inp: int) -> int:  # weight, its scales in int8, and the bias
        if precision == "fp32":
            return out * inp * FLOAT32 + out * FLOAT32
        return out * inp + out * FLOAT32 + out * FLOAT32

    layer = product(3 * d, d) + product(d, d)  # self-attention: stacked QKV, W^O
    layer += product(d, d) + product(d, d)  # cross-attention: W^Q, W^O
    layer += product(f, d) + product(d, f)  # feed-forward
    layer += 3 * 2 * d * FLOAT32  # three layer norms' gain and bias
    parts = {
        "weights": layers * layer,
        "output": product(vocab, d),
        "self_cache": layers * rows * 2 * (position + 1) * d * FLOAT32,
        "cross_cache": layers * sentences * 2 * src_len * d * FLOAT32,
        "embeddings": 2 * rows * d * FLOAT32,  # a token's row and its position's
    }
    parts["total"] = sum(parts.values())
    return parts


def copy_gb_per_s(array_bytes: int, threads: int, repeats: int) -> float:
    """STREAM's copy: 2 x `array_bytes` moved per `b.copy_(a)`, at `threads` threads, the
    best of `repeats` timings of enough copies to last about 20 ms; in GB/s (1e9 B)."""
    import torch

    torch.set_num_threads(threads)
    n = max(1024, array_bytes // FLOAT32)
    a, b = torch.rand(n), torch.empty(n)
    b.copy_(a)  # pages touched, caches warm
    began = time.perf_counter()
    b.copy_(a)
    once = max(time.perf_counter() - began, 1e-7)
    inner = max(1, int(0.02 / once))
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(inner):
            b.copy_(a)
        best = min(best, (time.perf_counter() - began) / inner)
    return 2 * n * FLOAT32 / best / 1e9


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache's size (Linux sysfs), or None where it is not said."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def step_records(name: str) -> tuple[dict, list[dict]]:
    """A bench_static_step results file: its args (size, dtype, threads, steps, src_len)
    and its records with a median step time."""
    data = json.loads((common.RESULTS / f"{name}.json").read_text())
    return data["args"], [r for r in data["results"] if r.get("ms_per_step") is not None]


def precision_of(system: str, dtype: str) -> str:
    """CTranslate2's precision is in its name; aiayn's is the file's `--dtype`."""
    return system.removeprefix("ct2-") if system.startswith("ct2-") else dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,base")
    parser.add_argument("--slots", default="1,32", help="rows per step (greedy), in turn")
    parser.add_argument("--src-len", type=int, default=30)
    parser.add_argument(
        "--position", type=int, default=15, help="the step's target position (mid-output of 30)"
    )
    parser.add_argument("--threads", default="1", help="bandwidth at each thread count")
    parser.add_argument("--array-mib", type=int, default=512, help="each DRAM copy array")
    parser.add_argument("--repeats", type=int, default=10, help="copy timings, best kept")
    parser.add_argument("--steps", default="", help="bench_static_step results files")
    parser.add_argument("--quick", action="store_true", help="64 MiB arrays, 3 repeats")
    parser.add_argument("--results", default="step-bound", help="results file name")
    args = parser.parse_args()
    if args.quick:
        args.array_mib, args.repeats = 64, 3
    thread_counts = [int(t) for t in args.threads.split(",")]
    llc = last_level_cache_bytes()
    dram = {t: copy_gb_per_s(args.array_mib << 20, t, args.repeats) for t in thread_counts}
    bounds = []
    for size in args.sizes.split(","):
        shape = common.SHAPES[size]
        for precision in ("fp32", "int8"):
            for rows in map(int, args.slots.split(",")):
                parts = step_bytes(
                    shape["d_model"], shape["ffn"], shape["layers"], common.VOCAB,
                    precision, rows, args.position, args.src_len,
                )  # fmt: skip
                for t in thread_counts:
                    at_size = copy_gb_per_s(parts["total"] // 2, t, args.repeats)
                    bounds.append(
                        dict(
                            size=size, precision=precision, slots=rows, threads=t,
                            bytes=parts, dram_gb_s=dram[t], at_size_gb_s=at_size,
                            fits_in_llc=None if llc is None else parts["total"] <= llc,
                            bound_ms=1000 * parts["total"] / (dram[t] * 1e9),
                            at_size_bound_ms=1000 * parts["total"] / (at_size * 1e9),
                        )
                    )  # fmt: skip
    steps = []
    for name in filter(None, args.steps.split(",")):
        step_args, records = step_records(name)
        dtype = step_args.get("dtype", "fp32")
        for r in records:
            precision = precision_of(r["system"], dtype)
            bound = next(
                (
                    b for b in bounds
                    if (b["size"], b["precision"], b["slots"], b["threads"])
                    == (step_args["size"], precision, r["slots"], int(step_args["threads"]))
                ),
                None,
            )  # fmt: skip
            if bound is None:
                continue
            steps.append(
                dict(
                    file=name, size=step_args["size"], precision=precision,
                    slots=r["slots"], threads=int(step_args["threads"]), system=r["system"],
                    ms_per_step=r["ms_per_step"], outside_gemm_ms=r.get("outside_gemm_ms"),
                    times_bound=r["ms_per_step"] / bound["bound_ms"],
                    times_at_size_bound=r["ms_per_step"] / bound["at_size_bound_ms"],
                )
            )  # fmt: skip
    rows = [
        [b["size"], b["precision"], b["slots"], b["threads"], f"{b['bytes']['total'] / 1e6:.2f}",
         f"{b['dram_gb_s']:.1f}", f"{b['bound_ms']:.3f}", f"{b['at_size_gb_s']:.1f}",
         f"{b['at_size_bound_ms']:.3f}", b["fits_in_llc"]]
        for b in bounds
    ]  # fmt: skip
    print(f"\nOne step's bytes and bounds; last-level cache {llc} B; {common.machine()}\n")
    headers = ["shape", "precision", "slots", "threads", "MB read", "DRAM GB/s", "bound ms"]
    print(common.table([*headers, "at-size GB/s", "at-size bound ms", "fits in LLC"], rows))
    if steps:
        print()
        print(
            common.table(
                ["file", "system", "slots", "ms/step", "x bound", "x at-size bound"],
                [
                    [
                        s["file"],
                        s["system"],
                        s["slots"],
                        f"{s['ms_per_step']:.3f}",
                        f"{s['times_bound']:.2f}",
                        f"{s['times_at_size_bound']:.2f}",
                    ]
                    for s in steps
                ],
            )
        )
    path = common.write_json(
        args.results,
        {
            "measures": {
                "system": "the bound memory traffic puts on one decoding step, and each "
                "system's step (bench_static_step files) against it",
                "cell": f"random Marian {' and '.join(args.sizes.split(','))}, fp32 and int8, "
                f"{args.slots} slots, {args.threads} thread(s), {common.machine()}",
                "harness": "bench_step_bound: step_bytes, a STREAM copy in torch",
            },
            "args": vars(args),
            "method": (
                "bytes: step_bytes (weights, output projection, float32 key/value caches at "
                "the position, embedding rows); bandwidth: torch copy_ of float32 arrays, 2 x "
                "array bytes per copy (STREAM's count), best of the repeats; DRAM arrays of "
                "--array-mib MiB each, at-size arrays of half the step's bytes each"
            ),
            "last_level_cache_bytes": llc,
            "bounds": bounds,
            "steps": steps,
        },
    )
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
