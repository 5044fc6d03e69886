"""benchmarks/bench_efficient.py: the per-kernel summary over seeds, by hand."""

from __future__ import annotations

import math

import pytest

from benchmarks.bench_efficient import KERNEL_SETTINGS, KERNELS, LRA_LISTOPS, summarise


def run(kernel: str, seed: int, accuracy: float, peak: float = 100.0) -> dict:
    return dict(kernel=kernel, seed=seed, test_accuracy=accuracy, best_valid_accuracy=None,
                tokens_per_s=None, peak_mib=peak, steps=10)  # fmt: skip


def test_the_summary_gives_each_kernels_mean_and_sample_std_in_the_kernels_order():
    runs = [run("linear", 0, 20.0), run("sdpa", 0, 30.0), run("sdpa", 1, 40.0)]
    runs += [run("sdpa", 2, 20.0, peak=400.0)]
    summary = summarise(runs)
    assert list(summary) == ["sdpa", "linear"]  # KERNELS' order, not the runs'
    sdpa = summary["sdpa"]
    assert sdpa["seeds"] == [0, 1, 2]
    assert sdpa["test_accuracy"] == pytest.approx(30.0)
    # sample std: sqrt(((30-30)^2 + (40-30)^2 + (20-30)^2) / (3 - 1)) = 10
    assert sdpa["test_accuracy_std"] == pytest.approx(10.0)
    assert sdpa["peak_mib"] == pytest.approx(200.0)
    assert sdpa["peak_mib_std"] == pytest.approx(math.sqrt((100**2 + 100**2 + 200**2) / 2))
    assert summary["linear"]["test_accuracy_std"] == 0.0  # one seed
    assert "best_valid_accuracy" not in sdpa  # never measured: absent, not 0


def test_every_kernel_has_its_settings_and_its_lra_counterpart():
    assert set(KERNEL_SETTINGS) == set(KERNELS) == set(LRA_LISTOPS)
    assert LRA_LISTOPS["sdpa"] == ("Transformer", 36.37)  # Tay et al. 2021, Table 1
