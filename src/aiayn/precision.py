"""Training arithmetic: which `Precision` a device gets, and the autocast and scaler for it.

The weights always stay float32; bf16 and fp16 autocast the forward pass (and so the
backward pass) to 16 bits, and fp16 also scales the loss so that small gradients do
not underflow. The `Precision` enum itself lives in `aiayn.config`.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from aiayn.config import Precision

log = logging.getLogger(__name__)


def has_native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 in hardware (CUDA that supports it, AMX or
    AVX512-BF16 CPUs); elsewhere bfloat16 is emulated and slower than float32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()


def resolve_precision(precision: Precision, device: torch.device) -> Precision:
    """`Precision.AUTO` made concrete for `device`; other precisions stay as they are.

    AUTO is bf16 on CUDA devices that support it and on CPUs with native bf16
    matrix units (AMX or AVX512-BF16, where bf16 trains faster than fp32), and fp32
    elsewhere, where bf16 would be emulated and slower.
    """
    if precision is not Precision.AUTO:
        return precision
    chosen = Precision.BF16 if has_native_bf16(device) else Precision.FP32
    log.info("precision auto -> %s on %s", chosen.value, device)
    return chosen


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
