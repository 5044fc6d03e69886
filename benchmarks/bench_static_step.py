"""One decoding step: today's cached decoder against the static step, eager, compiled and
AOTInductor-exported; with the compile times.

    python -m benchmarks.bench_static_step [--quick] [--slots 1,32] [--size small]

For a random-weight encoder-decoder of the size asked for (`ModelConfig.tiny` for
--quick, else `common`'s Marian sizes through `ModelConfig.base`'s shape), frozen in
fp32 (`freeze`), every system decodes `--steps` steps of greedy search for `--slots`
rows, after a warm-up of the same length, and reports the median time of one step:

- "cache": today's step, `EncoderDecoderDecoding.step` of the frozen model (a growing
  key/value cache, dozens of PyTorch calls from Python), plus the search's log-softmax;
- "static": `StaticStep.log_probs`, eager (fixed shapes, positions as tensors);
- "compiled": the same step through `torch.compile` (Inductor, C++ on the CPU);
- "aoti": the same step exported by `torch.export` and compiled ahead of time by
  AOTInductor (`torch._inductor.aoti_compile_and_package`), then loaded and called;
- "ct2-fp32", "ct2-int8" (with `--marian`): CTranslate2's whole decoding step on the
  same weights, from its greedy `translate_batch` forced to `--steps` tokens, less the
  same call forced to one (the encoder and the set-up), over the remaining steps, in a
  process of its own that has exited before the next system runs.

`--dtype int8` freezes aiayn's model with every product in int8, the output projection
included, as CTranslate2's int8 runs (`bench_step_bound` sets these step times against
the bound that memory traffic puts on a step).

`--marian` builds the model as a random-weight Marian of `common`'s shape (`small`: 3+3
layers of 256, 4 heads) read by aiayn, so that CTranslate2 runs the same weights; the
issue's batch-1 goal compares aiayn's time outside matrix products with CTranslate2's
whole step, in one run (`--marian --slots 1 --results step-overhead`).

Compile time is the first call's (compilation and warm-up), paid once per process
and slot count. "outside GEMM" is one step's time less its matrix products', from
`torch.profiler` (the issue's per-step overhead measure), for the eager systems.
The systems take turns for `--rounds` rounds, and each figure is the median over rounds
of a round's median step: one round of a 2 ms step moves by half its value from run to
run on this machine. The machine's load average is printed with the results: on a
shared machine the times are noisy, and only ratios of one run mean anything.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import common

SYSTEMS = ("cache", "static", "compiled", "aoti")
CT2_SYSTEMS = ("ct2-fp32", "ct2-int8")
GEMM_OPS = ("addmm", "mm", "bmm", "linear", "_linear_pointwise", "linear_dynamic", "matmul")


def build_model(size: str, max_len: int, dtype: str = "fp32"):
    import torch

    from aiayn import ModelConfig, build_model

    torch.manual_seed(0)
    if size == "tiny":
        cfg = ModelConfig.tiny(vocab_size=1000, max_len=max_len, dropout=0.0)
    else:
        width = {"small": 256, "base": 512}[size]
        cfg = ModelConfig.base(
            vocab_size=common.VOCAB,
            d_model=width,
            n_heads=8,
            d_ff=4 * width,
            max_len=max_len,
            dropout=0.0,
        )
    return frozen(build_model(cfg).eval(), dtype)


def marian_model(size: str, directory: Path, dtype: str = "fp32"):
    """A random-weight Marian of `common.SHAPES[size]` saved in `directory`, read by aiayn
    and frozen in `dtype`."""
    from aiayn.io.marian import load_marian_model

    common.save_random_marian(size, directory)
    return frozen(load_marian_model(directory).eval(), dtype)


def frozen(model, dtype: str):
    """`freeze(model)` in fp32, or in int8 every product in int8, the output projection
    included (CTranslate2's int8; `decode_systems.frozen`)."""
    from benchmarks.decode_systems import frozen as frozen_as

    return frozen_as(model, dtype, int8_output=True)


def ct2_step(system: str, marian: Path, slots: int, steps: int, src_len: int, threads: int):
    """CTranslate2's decoding step in ms: greedy decoding forced to `steps` tokens, less
    forced to 1, divided by the `steps - 1` steps between (medians of 5 each); the call is
    bench_decode's, with CTranslate2's own latency settings. Run by `ct2_step_alone`."""
    from benchmarks.decode_systems import ct2_runner

    quantization = system.removeprefix("ct2-")
    model_dir = marian.parent / f"ct2-{quantization}"
    if not (model_dir / "model.bin").exists():
        common.convert_ct2(marian, model_dir, None if quantization == "fp32" else "int8")
    run = ct2_runner(model_dir, threads, quantization)
    src = common.source_ids(slots, src_len)

    def call(n: int) -> float:
        began = time.perf_counter()
        run(src, 1, n)
        return time.perf_counter() - began

    call(steps)  # warm-up
    whole = statistics.median(call(steps) for _ in range(5))
    first = statistics.median(call(1) for _ in range(5))
    return {"system": system, "slots": slots, "ms_per_step": 1000 * (whole - first) / (steps - 1)}


def ct2_step_alone(*args) -> dict:
    """`ct2_step(*args)` in a fresh process of its own, which has exited when this returns:
    CTranslate2's OpenMP threads never share this process's cores with torch's, and no
    wait policy is forced on either (issue 44)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(ct2_step, *args).result()


def time_steps(step, n: int) -> list[float]:
    """Seconds of each of `n` calls of `step(i)`."""
    times = []
    for i in range(n):
        began = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - began)
    return times


def gemm_ms(step, n: int) -> float:
    """Milliseconds per step in matrix products, from torch.profiler (its second run: the
    first pays the profiler's start-up), over the steps 1 ... n - 1 of an output: step 0,
    where the cached search encodes its source, runs outside the profile, as the median
    step time leaves it out."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        step(0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(1, n):
                step(i)
    gemm_us = sum(
        e.self_cpu_time_total
        for e in prof.key_averages()
        if any(e.key.endswith(op) for op in GEMM_OPS)
    )
    return gemm_us / 1000 / (n - 1)


def measure(system: str, model, slots: int, steps: int, src_len: int) -> dict:
    import torch

    from aiayn.inference.decoding import start
    from aiayn.inference.search import normalised
    from aiayn.inference.static_step import StaticStep

    cfg = model.cfg
    src = torch.randint(3, cfg.vocab_size, (slots, src_len))
    src[:, -1] = cfg.eos_id
    record = {"system": system, "slots": slots}
    with torch.inference_mode():
        if system == "cache":

            def run(i: int) -> None:
                nonlocal state
                if i % steps == 0:
                    state = start(model, src)
                last = torch.full((slots,), cfg.bos_id if i % steps == 0 else 5)
                normalised(cfg, state.step(last))

            state = None
            began = time.perf_counter()
            run(0)
            record["compile_s"] = time.perf_counter() - began
        else:
            step = StaticStep(model, slots, max_target=steps + 1, max_source=src_len)
            step.load_source(torch.arange(slots), src)
            call = step.log_probs
            began = time.perf_counter()
            if system == "compiled":
                step.compile(log_probs=True)
            elif system == "aoti":
                call = aoti_step(step)
            record["compile_s"] = time.perf_counter() - began
            tokens = torch.full((slots,), cfg.bos_id)

            def run(i: int) -> None:
                call(tokens, torch.full((slots,), i % steps))

        for i in range(steps):  # warm-up: a whole output's steps
            run(i)
        record["ms_per_step"] = 1000 * statistics.median(time_steps(run, steps))
        if system in ("cache", "static"):  # the step's time without the profiler, less GEMM's
            record["outside_gemm_ms"] = record["ms_per_step"] - gemm_ms(run, steps)
    return record


def combine(measured: list[dict]) -> list[dict]:
    """One record per (system, slots), in the order first measured: the median over rounds
    of the step time and of the time outside GEMM, each round's values kept
    (`*_rounds`), and the first round's compile time (later rounds reuse its cache). A
    system that failed in any round keeps its first error."""
    grouped: dict[tuple[str, int], list[dict]] = {}
    for record in measured:
        grouped.setdefault((record["system"], record["slots"]), []).append(record)
    out = []
    for (system, slots), rounds in grouped.items():
        failed = [r for r in rounds if "error" in r]
        if failed:
            out.append(failed[0])
            continue
        record = {"system": system, "slots": slots, "rounds": len(rounds)}
        if "compile_s" in rounds[0]:
            record["compile_s"] = rounds[0]["compile_s"]
        for key in ("ms_per_step", "outside_gemm_ms"):
            values = [r[key] for r in rounds if key in r]
            if values:
                record[key] = statistics.median(values)
                record[f"{key}_rounds"] = values
        out.append(record)
    return out


def aoti_step(step):
    """The step exported (`torch.export`, caches as mutated buffers) and compiled ahead of
    time by AOTInductor; returns a function of (tokens, positions)."""
    import torch

    layers = len(step.self_keys)
    step.attention.unpack(step.model)  # packed and int8 products as plain tensors (they trace)
    step.trim = False  # fixed shapes

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for i, (k, v) in enumerate(zip(step.self_keys, step.self_values, strict=True)):
                self.register_buffer(f"k{i}", k)
                self.register_buffer(f"v{i}", v)

        def forward(self, tokens, positions):
            # the buffers as export traces them (functional), not the tensors themselves
            step.self_keys = [getattr(self, f"k{i}") for i in range(layers)]
            step.self_values = [getattr(self, f"v{i}") for i in range(layers)]
            return step._log_probs(tokens, positions)

    module = Step()
    tokens = torch.full((step.slots,), step.cfg.bos_id)
    positions = torch.zeros(step.slots, dtype=torch.long)
    exported = torch.export.export(module, (tokens, positions))
    path = Path(tempfile.mkdtemp()) / "step.pt2"
    torch._inductor.aoti_compile_and_package(exported, package_path=str(path))
    loaded = torch._inductor.aoti_load_package(str(path))
    return loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=("tiny", "small", "base"))
    parser.add_argument("--slots", default="1,32", help="rows per step, in turn")
    parser.add_argument("--steps", type=int, default=30, help="steps timed (and warmed up)")
    parser.add_argument("--src-len", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5, help="turns of every system")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--dtype",
        default="fp32",
        choices=("fp32", "int8"),
        help="aiayn's weights: fp32, or int8 in every product",
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {SYSTEMS}")
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 slot, 8 steps")
    parser.add_argument(
        "--marian",
        action="store_true",
        help="a random Marian of common's shape, which the ct2 systems run too",
    )
    parser.add_argument("--results", default="static_step", help="results file name")
    args = parser.parse_args()
    if args.quick:
        args.size, args.slots, args.steps, args.src_len, args.rounds = "tiny", "1", 8, 10, 1
    # before torch starts OpenMP: AOTInductor's library would use every core otherwise
    # (CTranslate2 inherits it in its own process; no wait policy is set: issue 44)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    systems = args.systems.split(",")
    known = SYSTEMS + (CT2_SYSTEMS if args.marian else ())
    unknown = [s for s in systems if s not in known]
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}; known: {', '.join(known)}")
    common.set_threads(args.threads)
    workdir = Path(tempfile.mkdtemp())
    if args.marian:
        if args.size == "tiny" or args.quick:
            parser.error("--marian takes --size small or base (common's shapes)")
        model = marian_model(args.size, workdir / "marian", args.dtype)
    else:
        model = build_model(args.size, max(64, args.steps + args.src_len + 2), args.dtype)
    measured = []
    for _ in range(args.rounds):  # the systems take turns, round by round
        for slots in map(int, args.slots.split(",")):
            for system in systems:
                try:
                    if system in CT2_SYSTEMS:
                        marian = workdir / "marian"
                        record = ct2_step_alone(
                            system, marian, slots, args.steps, args.src_len, args.threads
                        )
                    else:
                        record = measure(system, model, slots, args.steps, args.src_len)
                except Exception as err:  # a system this PyTorch cannot build is reported
                    record = {"system": system, "slots": slots, "error": repr(err)[:300]}
                measured.append(record)
    records = combine(measured)
    load = os.getloadavg()
    print(
        f"\nOne decoding step, {args.size} model in {args.dtype}, {args.threads} thread(s), "
        "median over "
        f"{args.rounds} rounds of each round's median of {args.steps} steps; load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {common.device_name('cpu')}\n"
    )
    rows = [
        [
            r["slots"],
            r["system"],
            "" if "ms_per_step" not in r else f"{r['ms_per_step']:.2f}",
            "" if "outside_gemm_ms" not in r else f"{r['outside_gemm_ms']:.2f}",
            "" if "compile_s" not in r else f"{r['compile_s']:.1f}",
            r.get("error", ""),
        ]
        for r in records
    ]
    print(
        common.table(["slots", "system", "ms/step", "outside GEMM ms", "compile s", "error"], rows)
    )
    if not args.quick:
        measures = {
            "system": f"one decoding step in {args.dtype}, systems {args.systems}",
            "cell": f"random {'Marian ' if args.marian else ''}{args.size}, {args.slots} slots, "
            f"{args.threads} thread(s), {common.machine()}",
            "harness": f"bench_static_step, {args.rounds} rounds in turns",
        }
        path = common.write_json(
            args.results,
            {"measures": measures, "args": vars(args), "load_printed": load, "results": records},
        )
        print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
