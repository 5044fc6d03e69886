"""benchmarks/plot_efficient.py: the lines it draws come from the results records, and it
writes a PNG."""

from __future__ import annotations

import json

from benchmarks.plot_efficient import curves, plot


def write(results, name: str, rows: list[dict]) -> None:
    (results / f"{name}.json").write_text(json.dumps({"efficient": {"results": rows}}))


def test_each_kernel_measure_and_device_is_a_line_of_its_measured_lengths(tmp_path):
    write(tmp_path, "attention", [
        {"length": 1024, "sdpa_train_ms": 2.0, "sdpa_train_peak_mib": 4.0, "linear_train_ms": 1.0},
        {"length": 4096, "sdpa_train_ms": 30.0, "linear_train_ms": 3.0, "skipped": {}},
    ])  # fmt: skip
    lines = curves(tmp_path)  # no attention-gpu.json: the CPU only
    assert lines[("CPU", "sdpa", "train_ms")] == [(1024, 2.0), (4096, 30.0)]
    assert lines[("CPU", "sdpa", "train_peak_mib")] == [(1024, 4.0)]  # 4096 not measured
    assert lines[("CPU", "linear", "train_ms")] == [(1024, 1.0), (4096, 3.0)]
    assert not any(device == "GPU" for device, _, _ in lines)
    write(tmp_path, "attention-gpu", [{"length": 1024, "performer_train_ms": 0.5}])
    assert curves(tmp_path)[("GPU", "performer", "train_ms")] == [(1024, 0.5)]
    out = plot(tmp_path / "plot.png", tmp_path)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
