"""How a training process on a CPU keeps its memory: oneDNN's kernel cache and glibc's malloc.

Two defaults of the CPU runtime slow a long run of variable-shaped batches:

- oneDNN compiles kernels for each shape of a product and keeps them in a cache of
  1,024 by default. Token-budget batches of translation pairs come in hundreds of
  shapes (sentences times length), each needing several kernels, so the cache evicts
  and compiles again for as long as the run lasts. `tune_host_memory` raises the
  capacity to `PRIMITIVE_CACHE_CAPACITY` through `ONEDNN_PRIMITIVE_CACHE_CAPACITY`,
  which oneDNN reads when it creates its first kernel.
- glibc's malloc gives every block above its mmap threshold pages of its own, and
  returns them when it is freed; it also hands the top of its heap back to the kernel
  past a trim threshold. A training step allocates and frees logits of tens of megabytes
  many times, so every one of them faults in fresh, zeroed pages. `tune_host_memory`
  keeps freed memory in the process instead (`mallopt`: no mmap, trim past 2 GiB).

On the quickstart's recipe, 1,600 updates of `aiayn train` on a 2-vCPU Xeon with AMX
took 4.16 and 4.08 training minutes with the larger cache alone, against 5.87 and 5.52
with the defaults, with identical losses (unrecorded runs, 2026-12-02; the sustained rate
fell from about 9,600 to 8,500 target tokens a second with the defaults and held at about
12,500 with the cache). The malloc setting is measured by `benchmarks/bench_host_memory.py`;
jemalloc in its place (`LD_PRELOAD`) took 4.68 and 4.58 minutes alone, and 3.63 and 3.66
with the cache. Neither setting changes any arithmetic.

The settings apply to the whole process, so only training calls this (the `Trainer`, on
a CPU), before its first product. A variable set by the user is kept, and
`AIAYN_HOST_MEMORY=default` leaves both defaults alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

PRIMITIVE_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
PRIMITIVE_CACHE_CAPACITY = 16384  # oneDNN's default is 1,024
OPT_OUT_ENV = "AIAYN_HOST_MEMORY"  # "default": change nothing

# glibc's mallopt parameters (malloc.h) and the values set
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
TRIM_THRESHOLD = 2**31 - 1  # bytes free at the heap's top before it is handed back
TOP_PAD = 64 * 2**20  # bytes added to every growth of the heap

_applied: list[str] | None = None


def tune_host_memory() -> list[str]:
    """Raise oneDNN's kernel cache and keep glibc's freed memory in the process, once.

    Returns:
        One phrase per setting, saying what it is now (for the run's log); the same
        list on every later call.
    """
    global _applied
    if _applied is None:
        _applied = _apply(os.environ)
    return _applied


def _apply(environ: os._Environ | dict[str, str]) -> list[str]:
    if environ.get(OPT_OUT_ENV, "").strip().lower() == "default":
        return [f"{OPT_OUT_ENV}=default: oneDNN's and malloc's defaults kept"]
    applied = []
    if PRIMITIVE_CACHE_ENV in environ:
        applied.append(f"{PRIMITIVE_CACHE_ENV}={environ[PRIMITIVE_CACHE_ENV]} (as set)")
    else:
        environ[PRIMITIVE_CACHE_ENV] = str(PRIMITIVE_CACHE_CAPACITY)
        applied.append(f"{PRIMITIVE_CACHE_ENV}={PRIMITIVE_CACHE_CAPACITY}")
    applied.append(keep_freed_memory())
    return applied


def keep_freed_memory() -> str:
    """Set glibc's malloc to serve every block from its heap and keep what is freed.

    Returns:
        What was done, or why nothing was: not Linux with glibc, or `mallopt` refused.
    """
    libc = _glibc()
    if libc is None:
        return "malloc: not glibc, left as it is"
    settings = {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: TRIM_THRESHOLD, M_TOP_PAD: TOP_PAD}
    refused = [param for param, value in settings.items() if libc.mallopt(param, value) != 1]
    if refused:
        return f"malloc: mallopt refused parameters {refused}"
    return "malloc: glibc keeps freed memory (no mmap, trim past 2 GiB)"


def _glibc() -> ctypes.CDLL | None:
    """glibc, when this process runs on it; None elsewhere (macOS, musl, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it)
    except (OSError, AttributeError):
        return None
    return libc
