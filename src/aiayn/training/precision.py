"""Training arithmetic: which `Precision` a device gets, and the autocast and scaler for it;
and what this machine's matrix products reach in each type (`measure_matmul_peak`, timed
by `fastest_seconds`, which inference's choice of precision times its steps with too).

The weights always stay float32; bf16 and fp16 autocast the forward pass (and so the
backward pass) to 16 bits, and fp16 also scales the loss so that small gradients do
not underflow. The `Precision` enum itself lives in `aiayn.config`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from aiayn.config import Precision

log = logging.getLogger(__name__)


def has_native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 in hardware (CUDA that supports it, AMX or
    AVX512-BF16 CPUs); elsewhere bfloat16 is emulated and slower than float32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()


def fastest_seconds(
    works: Sequence[Callable[[], object]], repeats: int, device: torch.device
) -> list[float]:
    """The fastest of `repeats` timings of each of `works`, in seconds, in their order.

    Each work runs once untimed first (kernels chosen, memory touched). Then the works
    take turns, `repeats` rounds of one run each, so that a load that comes and goes on
    the machine meanwhile slows them alike. On CUDA each timing waits for the device
    before and after.

    Args:
        works: what to time, each called with no arguments.
        repeats: timed runs of each (>= 1).
        device: where the works run.

    Raises:
        ValueError: `repeats` below 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for work in works:  # warm-up
        work()
    best = [math.inf] * len(works)
    for _ in range(repeats):
        for i, work in enumerate(works):
            sync()
            started = time.perf_counter()
            work()
            sync()
            best[i] = min(best[i], time.perf_counter() - started)
    return best


@dataclass(frozen=True)
class MatmulPeak:
    """The best rate of a square matrix product on this machine, as measured.

    Attributes:
        dtype: "float32" or "bfloat16".
        shape: (M, N, K) of the product timed.
        threads: torch's intra-op threads during the timing (CPU).
        gflops: the best of `repeats` timings, in GFLOP/s.
        repeats: timings taken (after one warm-up).
    """

    dtype: str
    shape: tuple[int, int, int]
    threads: int
    gflops: float
    repeats: int


def measure_matmul_peak(
    dtype: torch.dtype = torch.float32,
    size: int = 1024,
    repeats: int = 5,
    device: str | torch.device = "cpu",
) -> MatmulPeak:
    """Time `repeats` products of two `size` x `size` matrices; keep the fastest.

    With the defaults, under a second on a 2-core CPU. It measures what torch's matmul
    reaches here, on the current thread count, not the hardware's data-sheet peak.

    Raises:
        ValueError: `size` or `repeats` below 1.
    """
    if size < 1 or repeats < 1:
        raise ValueError(f"size and repeats must be >= 1, got {size}, {repeats}")
    device = torch.device(device)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device, dtype)
    b = torch.randn(size, size, generator=generator).to(device, dtype)
    with torch.no_grad():
        (best,) = fastest_seconds([lambda: torch.mm(a, b)], repeats, device)
    flops = 2 * size**3
    return MatmulPeak(
        dtype=str(dtype).removeprefix("torch."),
        shape=(size, size, size),
        threads=torch.get_num_threads(),
        gflops=flops / best / 1e9,
        repeats=repeats,
    )


SPEEDUP_SIZE = 1024  # the square product `bf16_matmul_speedup` times
BF16_MIN_SPEEDUP = 1.1  # auto takes bf16 on the CPU only where its products are this much faster


@functools.cache
def bf16_matmul_speedup(threads: int | None = None) -> float:
    """How much faster this CPU multiplies bfloat16 than float32 (> 1: bf16 is faster).

    The ratio of `measure_matmul_peak` in each type (the best of a few
    timed `SPEEDUP_SIZE` products), on torch's current threads (`threads` only keys
    the cache). A CPU may report AVX512-BF16 and still multiply bf16 slower than fp32
    (docs/explanation/results/cpu-inference.md): the flag alone does not say. Timed once
    per process and thread count.
    """
    fp32 = measure_matmul_peak(torch.float32, SPEEDUP_SIZE)
    bf16 = measure_matmul_peak(torch.bfloat16, SPEEDUP_SIZE)
    return bf16.gflops / fp32.gflops


def resolve_precision(precision: Precision, device: torch.device) -> Precision:
    """`Precision.AUTO` made concrete for `device`; other precisions stay as they are.

    AUTO is bf16 on CUDA devices that support it, and on CPUs that multiply bf16
    natively (AMX or AVX512-BF16) where a short timing (`bf16_matmul_speedup`) shows
    bf16 products at least `BF16_MIN_SPEEDUP` times faster than fp32's; fp32
    elsewhere, where bf16 would be emulated or, as measured on AVX512-BF16 without
    AMX, slower.
    """
    if precision is not Precision.AUTO:
        return precision
    if device.type == "cuda" or not has_native_bf16(device):
        chosen = Precision.BF16 if has_native_bf16(device) else Precision.FP32
        log.info("precision auto -> %s on %s", chosen.value, device)
        return chosen
    speedup = bf16_matmul_speedup(torch.get_num_threads())
    chosen = Precision.BF16 if speedup >= BF16_MIN_SPEEDUP else Precision.FP32
    log.info(
        "precision auto -> %s on %s (bf16 products measured %.2fx fp32's; bf16 needs %.1fx)",
        chosen.value,
        device,
        speedup,
        BF16_MIN_SPEEDUP,
    )
    return chosen


def auto_choice(precision: Precision, device: torch.device) -> dict[str, object]:
    """What `resolve_precision` chose for `precision` on `device`, and on what measure.

    Returns:
        {"requested": the precision asked for, "chosen": what it resolved to, and where
        AUTO timed the products on this CPU, "bf16_matmul_speedup": the measured ratio
        (bf16 GFLOP/s over fp32's) and "bf16_min_speedup": the ratio bf16 needs}. The
        timing is `bf16_matmul_speedup`'s, cached, so a run that already resolved AUTO
        does not time it again.
    """
    chosen = resolve_precision(precision, device)
    choice: dict[str, object] = {"requested": precision.value, "chosen": chosen.value}
    if precision is Precision.AUTO and device.type == "cpu" and has_native_bf16(device):
        choice["bf16_matmul_speedup"] = round(bf16_matmul_speedup(torch.get_num_threads()), 2)
        choice["bf16_min_speedup"] = BF16_MIN_SPEEDUP
    return choice


def choice_line(choice: dict[str, object]) -> str:
    """`auto_choice` for people: "precision: bf16 (auto: bf16 products measured 2.11x ...)"."""
    line = f"precision: {choice['chosen']}"
    if choice["requested"] != choice["chosen"]:
        line += f" ({choice['requested']}"
        if "bf16_matmul_speedup" in choice:
            line += (
                f": bf16 products measured {choice['bf16_matmul_speedup']:.2f}x fp32's here; "
                f"bf16 needs {choice['bf16_min_speedup']:g}x"
            )
        line += ")"
    return line


def training_precision(precision: Precision, device: torch.device) -> Precision:
    """`resolve_precision`, refusing what training cannot do on `device`.

    Raises:
        ValueError: fp16 on a device other than CUDA.
    """
    resolved = resolve_precision(precision, device)
    if resolved is Precision.FP16 and device.type != "cuda":
        raise ValueError("TrainConfig.precision fp16 needs a CUDA device; use bf16 or fp32")
    return resolved


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager:
    """The context the forward pass runs in: nothing for fp32, `torch.autocast` otherwise."""
    if precision is Precision.FP32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=precision.dtype)


def grad_scaler(precision: Precision, device: torch.device) -> torch.amp.GradScaler:
    """A gradient scaler that scales for fp16 and passes everything through otherwise."""
    return torch.amp.GradScaler(device.type, enabled=precision is Precision.FP16)
