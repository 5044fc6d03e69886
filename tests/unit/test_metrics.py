"""Run metrics: the window's means, metrics.jsonl, and the formatted lines."""

from __future__ import annotations

import json
import math

import pytest

from aiayn.training.metrics import (
    METRICS_FILE,
    MetricsLog,
    Window,
    format_duration,
    train_line,
    valid_line,
)


def test_window_means_are_per_target_token_over_all_updates():
    window = Window()
    window.add({"loss": 30.0, "nll": 20.0, "tokens": 10, "lr": 1e-3})
    window.add({"loss": 10.0, "nll": 10.0, "tokens": 30, "lr": 2e-3})
    out = window.flush()
    assert (out["loss"], out["nll"], out["lr"]) == (1.0, 0.75, 2e-3)
    assert out["ppl"] == pytest.approx(math.exp(0.75)) and out["tokens_per_update"] == 20
    assert window.updates == 0 and window.tokens == 0  # a new window


def test_metrics_log_appends_json_lines_and_writes_nothing_when_disabled(tmp_path):
    with MetricsLog(tmp_path / "off", 0, enabled=False) as off:
        off.write("train", 1, {"loss": 1.0})
    assert not (tmp_path / "off").exists()
    for step in (1, 2):
        with MetricsLog(tmp_path, 0) as metrics:
            metrics.write("valid", step, {"loss": 0.5, "ppl": 1.6})
    lines = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [(line["kind"], line["step"], line["loss"]) for line in lines] == [
        ("valid", 1, 0.5),
        ("valid", 2, 0.5),
    ]
    assert all(isinstance(line["time"], float) for line in lines)


def test_a_non_finite_loss_is_written_as_null_not_as_bare_nan(tmp_path):
    """metrics.jsonl stays JSON (issue 42): Python's json would write NaN and Infinity."""
    with MetricsLog(tmp_path, 0) as metrics:
        metrics.write("train", 1, {"loss": math.nan, "ppl": math.inf, "lr": 1e-3})
    text = (tmp_path / METRICS_FILE).read_text()
    assert "NaN" not in text and "Infinity" not in text
    line = json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name}"))
    assert (line["loss"], line["ppl"], line["lr"]) == (None, None, 1e-3)


def test_log_lines_and_durations():
    train = {"loss": 2.34567, "lr": 0.000123456, "tgt_tokens_per_s": 1234.5, "epoch": 1.234}
    assert train_line(7, train) == "update 7: loss 2.3457, lr 0.000123, 1234 tgt tok/s, epoch 1.23"
    valid = {"loss": 1.0, "ppl": 2.718}
    assert valid_line(8, valid) == "valid at update 8: loss 1.0000, ppl 2.72"
    assert valid_line(8, {**valid, "bleu": 12.345}).endswith(", BLEU 12.35")
    assert (format_duration(3725.9), format_duration(-3)) == ("1:02:05", "0:00:00")
