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

jemalloc serves the same blocks faster still and holds less memory: `aiayn train` and
`aiayn quickstart` start themselves again with it preloaded (`restart_with_jemalloc`)
where it is installed (Debian's `libjemalloc2`, which `make demo` installs), and the
malloc setting is then left alone. `benchmarks/bench_host_memory.py` races the three.

The settings apply to the whole process, so only training calls this (the `Trainer`, on
a CPU), before its first product. A variable set by the user is kept (an `LD_PRELOAD`
too: jemalloc is added to it); `AIAYN_HOST_MEMORY=glibc` keeps glibc's malloc (with the
setting above), and `AIAYN_HOST_MEMORY=default` leaves every default alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

PRIMITIVE_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
PRIMITIVE_CACHE_CAPACITY = 16384  # oneDNN's default is 1,024
OPT_OUT_ENV = "AIAYN_HOST_MEMORY"  # "default": change nothing; "glibc": no jemalloc
JEMALLOC = "libjemalloc.so.2"
RESTARTED_ENV = "AIAYN_HOST_MEMORY_RESTARTED"  # set in the restarted process: never twice

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
    if _choice(environ) == "default":
        return [f"{OPT_OUT_ENV}=default: oneDNN's and malloc's defaults kept"]
    applied = []
    if PRIMITIVE_CACHE_ENV in environ:
        applied.append(f"{PRIMITIVE_CACHE_ENV}={environ[PRIMITIVE_CACHE_ENV]} (as set)")
    else:
        environ[PRIMITIVE_CACHE_ENV] = str(PRIMITIVE_CACHE_CAPACITY)
        applied.append(f"{PRIMITIVE_CACHE_ENV}={PRIMITIVE_CACHE_CAPACITY}")
    applied.append("malloc: jemalloc (preloaded)" if jemalloc_loaded() else keep_freed_memory())
    return applied


CHOICES = ("", "glibc", "default")  # AIAYN_HOST_MEMORY: everything, no jemalloc, nothing


def _choice(environ: os._Environ | dict[str, str]) -> str:
    """AIAYN_HOST_MEMORY, lowercased: "" (everything), "glibc" or "default".

    Raises:
        ValueError: any other value (a misspelt opt-out must not tune silently).
    """
    choice = environ.get(OPT_OUT_ENV, "").strip().lower()
    if choice not in CHOICES:
        raise ValueError(
            f"{OPT_OUT_ENV}={environ[OPT_OUT_ENV]!r}: expected 'glibc' (no jemalloc) or "
            "'default' (PyTorch's and glibc's defaults), or unset"
        )
    return choice


def jemalloc_loaded() -> bool:
    """Whether jemalloc is mapped into this process (preloaded), from /proc/self/maps."""
    try:
        return "libjemalloc" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def restart_with_jemalloc() -> str:
    """Start this `aiayn` command again, in this process, with jemalloc preloaded.

    Called first thing by `aiayn train` and `aiayn quickstart` (a library cannot change
    its own process's allocator once it runs). It does not return when it restarts;
    it returns why not otherwise: not the `aiayn` program, opted out, restarted already,
    jemalloc loaded already, not Linux, or jemalloc not installed.
    """
    if not _started_as_aiayn():
        return "not started as the aiayn command"
    choice = _choice(os.environ)
    if choice:
        return f"{OPT_OUT_ENV}={choice}"
    if jemalloc_loaded():
        return "jemalloc loaded"
    if os.environ.get(RESTARTED_ENV):
        return "restarted once already"
    if not sys.platform.startswith("linux") or ctypes.util.find_library("jemalloc") is None:
        return f"{JEMALLOC} not installed (Debian: apt-get install libjemalloc2)"
    preload = " ".join(filter(None, [JEMALLOC, os.environ.get("LD_PRELOAD", "")]))
    env = {**os.environ, "LD_PRELOAD": preload, RESTARTED_ENV: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)
    raise AssertionError("unreachable: execve returned")  # pragma: no cover


def _started_as_aiayn() -> bool:
    """Whether this process is the `aiayn` program (its script, or `python -m aiayn`), not
    a test runner or a user's script that called a command in-process."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return Path(sys.argv[0]).name == "aiayn" or (spec is not None and spec.name == "aiayn.__main__")


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
