"""Which device a command runs on: a name checked once, before any work.

`torch.device` takes names of devices this build of PyTorch cannot use (xla, mps
on Linux, cuda without a GPU) and "meta", which holds shapes but no values; each
would fail later, deep inside a model. `usable_device` refuses them by name.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def usable_device(name: str, option: str = "--device") -> torch.device:
    """The device `name` names, if a model can run there.

    Args:
        name: a device name: cpu, cuda, cuda:1, mps, ...
        option: what to call it in an error (the command-line option, a field).

    Returns:
        The `torch.device`.

    Raises:
        ValueError: naming `option` and `name`: not a device name; meta (no values);
            CUDA without a GPU; or a device this PyTorch cannot allocate on.
    """
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"{option} {name}: not a device name (cpu, cuda, cuda:1, ...)") from None
    if device.type == "meta":
        raise ValueError(
            f"{option} {name}: meta tensors hold shapes but no values, so no model runs "
            "there; use cpu or cuda"
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{option} {name}: no CUDA device is available here")
    try:
        torch.empty(1, device=device)
    except (RuntimeError, NotImplementedError, AssertionError, ImportError):
        # PyTorch names any device type it knows, built in or not (xla, mps, hpu, ...).
        raise ValueError(
            f"{option} {name}: this PyTorch cannot run on {device.type} devices here; "
            "use cpu or cuda"
        ) from None
    return device


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it ("AMD EPYC", "Intel(R) Xeon(R) ..."),
    or the platform's word for it where there is no /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def machine() -> str:
    """This machine as results record it: the CPU model and its core count
    ("AMD EPYC, 2 cores"). Figures measured on one CPU are compared by this name."""
    return f"{cpu_model()}, {os.cpu_count()} cores"
