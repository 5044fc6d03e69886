"""Another CPU's kernels on this one: the environment that makes PyTorch and oneDNN run
kernels of another SIMD width than this CPU's own, so that float sums run in another
order, as on another machine (issue 41: `make test`'s second pass, `make audit-cpus`).

    python tests/variants/kernels.py    # NAME=VALUE pairs, for `env`

On an AVX-512 CPU (with or without AMX) that is PyTorch's and oneDNN's AVX2 code; on a
CPU whose best is AVX2, the AVX2 set would change nothing (measured on an AVX2-only AMD
EPYC: the same losses to the last digit), so there it is PyTorch's plain vectorized
code (`default`) and oneDNN's SSE4.1 kernels.
"""

from __future__ import annotations

import sys

import torch

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
BELOW_AVX2 = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}


def other_kernels(native: str | None = None) -> dict[str, str]:
    """The environment of another kernel set than `native` (this CPU's own, as
    `torch.backends.cpu.get_cpu_capability()` names it: "AVX512", "AVX2", ...)."""
    native = native or torch.backends.cpu.get_cpu_capability()
    return AVX2 if native.upper().startswith("AVX512") else BELOW_AVX2


def main() -> None:
    kernels = other_kernels()
    native = torch.backends.cpu.get_cpu_capability()
    print(" ".join(f"{k}={v}" for k, v in kernels.items()))
    print(f"another CPU's kernels: {kernels['ATEN_CPU_CAPABILITY']} (this CPU's: {native})",
          file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
