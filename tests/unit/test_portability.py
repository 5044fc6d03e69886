"""Issue 41: results say which CPU they came from, `precision: auto` says what it chose and
on what measure, and the audit's variants (another kernel set, shifted seeds) take effect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import aiayn.training.precision as precision_module
from aiayn.apps.quickstart import other_machine_line
from aiayn.config import Precision
from aiayn.config.devices import cpu_model, machine
from aiayn.training.precision import auto_choice, choice_line

VARIANTS = Path(__file__).resolve().parents[1] / "variants"


def test_the_machine_is_named_by_its_cpu_model_and_cores():
    cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    models = [ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if "model name" in ln]
    assert cpu_model() == models[0]
    assert machine() == f"{models[0]}, {os.cpu_count()} cores"


def test_a_reference_from_another_machine_is_said_in_one_line():
    reference = {"machine": "AMD EPYC, 2 cores", "bleu": [25.0]}
    line = other_machine_line(reference, "Intel(R) Xeon(R) Platinum 8481C, 2 cores")
    assert line.startswith(
        "the references came from AMD EPYC, 2 cores; this is Intel(R) Xeon(R) Platinum 8481C"
    )
    assert "\n" not in line
    assert other_machine_line(reference, "AMD EPYC, 2 cores") is None
    assert other_machine_line(None, "AMD EPYC, 2 cores") is None


@pytest.mark.parametrize(("speedup", "chosen"), [(3.4, "bf16"), (0.9, "fp32")])
def test_auto_chooses_by_the_measured_ratio_and_records_it(monkeypatch, speedup, chosen):
    monkeypatch.setattr(precision_module, "has_native_bf16", lambda device: True)
    monkeypatch.setattr(precision_module, "bf16_matmul_speedup", lambda threads=None: speedup)
    choice = auto_choice(Precision.AUTO, torch.device("cpu"))
    assert choice == {
        "requested": "auto",
        "chosen": chosen,
        "bf16_matmul_speedup": speedup,
        "bf16_min_speedup": precision_module.BF16_MIN_SPEEDUP,
    }
    assert choice_line(choice) == (
        f"precision: {chosen} (auto: bf16 products measured {speedup:.2f}x fp32's here; "
        "bf16 needs 1.1x)"
    )


def test_a_fixed_precision_is_not_timed(monkeypatch):
    def never(threads=None):
        raise AssertionError("timed")

    monkeypatch.setattr(precision_module, "bf16_matmul_speedup", never)
    choice = auto_choice(Precision.FP32, torch.device("cpu"))
    assert choice == {"requested": "fp32", "chosen": "fp32"}
    assert choice_line(choice) == "precision: fp32"


def _python(code: str, **env: str) -> str:
    environment = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.skipif(
    "avx2" not in Path("/proc/cpuinfo").read_text(), reason="needs an x86-64 CPU with AVX2"
)
def test_the_second_kernel_set_takes_effect_and_changes_float_results():
    """make test's second pass (Makefile, tests/variants/kernels.py) really runs other
    kernels than this CPU's own, and they compute floats in another order. Which ops
    change depends on the CPU: on an AVX-512 EPYC of 2026-12-02 the AVX2 set left plain
    sums, float32 products and layer norm bit for bit the same, and changed the softmax
    (and GELU, bfloat16 products); so both are printed."""
    listed = subprocess.run(
        [sys.executable, str(VARIANTS / "kernels.py")], capture_output=True, text=True, check=True
    ).stdout.split()
    other = dict(pair.split("=", 1) for pair in listed)
    assert other["ATEN_CPU_CAPABILITY"] in ("avx2", "default") and "ONEDNN_MAX_CPU_ISA" in other
    code = (
        "import torch; torch.manual_seed(0); x = torch.randn(64, 4096); "
        "print(torch.backends.cpu.get_cpu_capability(), x.sum(1).tolist(), "
        "x.softmax(-1)[:, :8].tolist())"
    )
    native, elsewhere = _python(code), _python(code, **other)
    assert elsewhere.split()[0] == other["ATEN_CPU_CAPABILITY"].upper() != native.split()[0]
    assert elsewhere.split(maxsplit=1)[1] != native.split(maxsplit=1)[1]  # other floats


def test_a_seed_shift_runs_every_seed_as_seed_plus_the_shift():
    code = (
        "import torch, numpy, random; torch.manual_seed(5); a = torch.rand(2).tolist(); "
        "g = torch.Generator().manual_seed(5); b = torch.rand(2, generator=g).tolist(); "
        "c = numpy.random.default_rng([5, 1]).random(2).tolist(); "
        "random.seed(5); d = random.random(); import json; print(json.dumps([a, b, c, d]))"
    )
    plain = _python(code)
    shifted = _python(code, AIAYN_SEED_SHIFT="2", PYTHONPATH=str(VARIANTS))
    again = _python(code, AIAYN_SEED_SHIFT="2", PYTHONPATH=str(VARIANTS))
    expected, got = json.loads(plain), json.loads(shifted)
    assert shifted == again  # still reproducible
    assert all(x != y for x, y in zip(expected, got, strict=True))  # every generator moved
    torch.manual_seed(7)
    assert got[0] == torch.rand(2).tolist()  # torch's seed 5 ran as 7
    assert _python(code, PYTHONPATH=str(VARIANTS)) == plain  # no shift: untouched
