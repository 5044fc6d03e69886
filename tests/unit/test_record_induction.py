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


def test_the_phase_change_is_the_first_checkpoint_a_nat_below_the_first_half():
    from benchmarks.record_induction import phase_change

    points = [
        {"step": 100, "first_half": 4.1, "repeated_half": 4.0},
        {"step": 200, "first_half": 4.1, "repeated_half": 3.2},  # 0.9 below: not yet
        {"step": 300, "first_half": 4.2, "repeated_half": 3.2},  # exactly 1 nat
        {"step": 400, "first_half": 4.2, "repeated_half": 0.5},
    ]
    assert phase_change(points) == 300
    assert phase_change(points[:2]) is None


def test_goals_judge_every_seed_by_the_issue_s_thresholds():
    from benchmarks.record_induction import goals

    def rises(repeated, first, zero_first=None):
        zero = {
            "repeated_half_rise": repeated,
            "first_half_rise": first if zero_first is None else zero_first,
        }
        return {"zero": zero, "mean": {"repeated_half_rise": repeated, "first_half_rise": first}}

    def run(seed, prefix, copying, previous, rise, first_rise, phase=500, highest=True):
        return {
            "seed": seed,
            "phase_change_step": phase,
            "copying": [[0.0, 0.0], [copying, -1.0]],
            "aiayn_induction": {"induction": [[0.0, 0.0], [prefix, 0.9]],
                                "previous_token": [[previous, 0.1], [0.0, 0.0]]},
            "circuit": {
                "induction_head": [1, 0], "previous_token_partner": [0, 1],
                "pair_k_composition": 0.3, "pair_k_composition_highest": highest,
                "ablations": [  # the head, its partner, both, every induction head
                    rises(rise, first_rise, zero_first=0.45),
                    rises(3.0, 0.01),
                    rises(3.5, 0.02),
                    {"heads": [[1, 0], [1, 1]], **rises(5.0, 0.03)},
                ],
            },
        }  # fmt: skip

    good = goals([run(0, 0.8, 0.7, 0.9, 2.5, 0.02), run(1, 0.6, 0.5, 0.5, 1.0, 0.09)])
    assert good["ablation"] == "mean"
    assert good["phase_change_every_seed"] and good["heads_every_seed"]
    # judged on mean ablation: zeroing raised the first half by 0.45, the mean by 0.02
    assert good["ablation_every_seed"] and good["pair_k_composition_every_seed"]
    first = good["per_seed"][0]
    assert (first["ablation_first_rise"], first["zero_ablation_first_rise"]) == (0.02, 0.45)
    # head 1 of layer 1 matches prefixes (0.9) but does not copy (-1): head 0 is the one
    assert first["layer1_head_prefix_and_copying"] == 0.7
    # the partner and every induction head are recorded beside the goal's single head
    assert first["mean_partner_repeated_rise"] == 3.0
    assert first["induction_heads"] == 2
    assert first["mean_all_repeated_rise"] == 5.0
    bad = goals(
        [run(0, 0.8, 0.4, 0.9, 2.5, 0.02), run(1, 0.8, 0.7, 0.9, 0.9, 0.1, None, highest=False)]
    )
    assert not bad["heads_every_seed"]  # copying 0.4 < 0.5
    assert not bad["ablation_every_seed"] and not bad["phase_change_every_seed"]
    assert not bad["pair_k_composition_every_seed"]
