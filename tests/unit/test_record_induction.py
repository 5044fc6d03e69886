"""benchmarks/record_induction.py: the validation curve it reads and the heads it ranks."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks.record_induction import top_heads, validation_curve


def test_the_curve_is_the_validations_with_an_in_context_loss(tmp_path):
    records = [
        {"kind": "train", "step": 50, "loss": 6.0},
        {"kind": "valid", "step": 50, "loss": 5.5, "ppl": 244.7},  # before the metric existed
        {"kind": "valid", "step": 100, "loss": 5.123456, "in_context_loss": -0.25,
         "early_loss": 5.5, "late_loss": 5.25},
        {"kind": "valid", "step": 150, "loss": 4.9, "in_context_loss": -0.5,
         "early_loss": 5.4, "late_loss": 4.9},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    curve = validation_curve(tmp_path)
    assert [r["step"] for r in curve] == [100, 150]
    assert curve[0] == {
        "step": 100, "loss": 5.1235, "in_context_loss": -0.25, "early_loss": 5.5,
        "late_loss": 5.25,
    }  # fmt: skip


def test_a_run_without_the_metric_is_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"no metrics\.jsonl"):
        validation_curve(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "valid", "step": 1, "loss": 1}))
    with pytest.raises(SystemExit, match="no validation with an in-context loss"):
        validation_curve(tmp_path)


def test_top_heads_ranks_the_grid_and_skips_missing_heads():
    grid = torch.tensor([[0.1, 0.9, math.nan], [0.5, 0.2, 0.95]])
    assert top_heads(grid, 2) == [
        {"layer": 1, "head": 2, "score": 0.95},
        {"layer": 0, "head": 1, "score": 0.9},
    ]
