"""The report's efficient-attention table: rendered from bench_attention's "efficient"
record once it exists, with skipped cells, the crossover line and the decoding table."""

from __future__ import annotations

import json

from benchmarks import report as bench_report

KERNELS = ("sdpa", "sliding_window", "bigbird", "linear", "performer")
CAUSAL = ("sdpa", "sliding_window", "linear", "performer")


def record(length, sdpa_ms):
    row = {"device": "cpu", "length": length, "skipped": {}}
    for i, kernel in enumerate(KERNELS):
        row[f"{kernel}_train_ms"] = 100.0 + i
        row[f"{kernel}_train_peak_mib"] = 10.0 + i
    row["sdpa_train_ms"] = sdpa_ms
    return row


def test_the_table_renders_once_the_record_exists(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_report, "RESULTS", tmp_path)
    (tmp_path / "attention.json").write_text(json.dumps({"results": []}))
    assert not bench_report.WHEN["efficient-attention"]()

    decoding = {"device": "cpu", "position": 16384}
    for i, kernel in enumerate(CAUSAL):
        decoding[f"{kernel}_step_ms"], decoding[f"{kernel}_cache_mib"] = 1.0 + i, 2.0 + i
    efficient = {
        "date": "2026-11-25 20:00",
        "results": [record(1024, 50.0), record(65536, None)],
        "decoding": [decoding],
        "crossover": {"cpu": {"sliding_window": 65536, "bigbird": None}},
    }
    (tmp_path / "attention.json").write_text(json.dumps({"results": [], "efficient": efficient}))
    assert bench_report.WHEN["efficient-attention"]()
    text = bench_report.TABLES["efficient-attention"]()
    lines = text.splitlines()
    assert lines[2] == (
        "| cpu | 1,024 | 50.0 | 10.0 | 101 | 11.0 | 102 | 12.0 | 103 | 13.0 | 104 | 14.0 |"
    )
    assert lines[3].startswith("| cpu | 65,536 | skipped | 10.0 | 101 |")
    assert "beats SDPA's: cpu: sliding_window 65,536, bigbird none." in text
    assert "| cpu | 16,384 | 1.00 | 2.00 | 2.00 | 3.00 | 3.00 | 4.00 | 4.00 | 5.00 |" in text
    assert "`benchmarks/results/attention.json` record `efficient`" in text


def test_the_char_lm_tables_say_each_kernels_seeds_and_its_loss_by_position(monkeypatch, tmp_path):
    from benchmarks.report.efficient import efficient_positions, efficient_task

    monkeypatch.setattr(bench_report, "RESULTS", tmp_path)
    curve = {"edges": [0, 1, 2, 4], "bpc": [3.5, 3.25, 3.125]}
    kernels = {
        "sdpa": {"seeds": [1, 0], "test_bpc": 3.3, "test_bpc_std": 0.1, "steps": 1200.0,
                 "peak_mib": 400.0, "test_bpc_by_position": curve},
        "linear": {"seeds": [0], "test_bpc": 3.4, "test_bpc_std": 0.0, "steps": 1200.0,
                   "peak_mib": 450.0, "test_bpc_by_position": curve},
    }  # fmt: skip
    data = {"date": "2026-11-27 19:00", "task": "charlm-cpu", "metric": "bpc", "context": 256,
            "args": {"device": "cpu", "parallel": "2"}, "runs": [{}, {}, {}],
            "baselines": {"unigram_bpc": {"valid": 4.4, "test": 4.43}}, "kernels": kernels}  # fmt: skip
    (tmp_path / "efficient-charlm-cpu.json").write_text(json.dumps(data))
    said = efficient_task("efficient-charlm-cpu")
    assert "3 runs, seeds sdpa 0, 1; linear 0, 2 at a time on the CPU" in said
    assert "blocks of 256." in said
    table = efficient_positions("efficient-charlm-cpu").splitlines()
    assert table[0] == "| kernel | 0 | 1 | 2–3 |"
    assert table[2] == "| sdpa | 3.50 | 3.25 | 3.12 |"  # 3.125 rounds half to even
