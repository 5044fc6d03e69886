"""Issue 50's goal rows in the report's goals table (benchmarks/report/verdicts.py
`induction_goals`), from a hand-made results file of record_induction's shape, and the
heads page's table of attempts with several head counts."""

from __future__ import annotations

import json

from benchmarks import report as bench_report
from benchmarks.report import analysis, verdicts


def seed(number: int, phase: int | None, heads: float, rise: float, first: float) -> dict:
    rises = {}
    for how in ("zero", "mean"):  # zeroing raises the first half more than the mean does
        for key, (repeated, first_half) in {
            "ablation": (rise, first + 0.4 * (how == "zero")),
            "partner": (3.0, 0.01),
            "all": (5.0, 0.02),
        }.items():
            rises[f"{how}_{key}_repeated_rise"] = repeated
            rises[f"{how}_{key}_first_rise"] = first_half
    return {
        "seed": number,
        "phase_change_step": phase,
        "layer1_head_prefix_and_copying": heads,
        "layer0_previous_token": 0.8,
        "induction_head": [1, 1],
        "previous_token_partner": [0, 0],
        "pair_k_composition": 0.31,
        "pair_k_composition_highest": number != 2,
        "ablation_repeated_rise": rise,
        "ablation_first_rise": first,
        **rises,
        "induction_heads": 2,
    }


def run(number: int, seconds: float, n_heads: int = 8, d_model: int = 64) -> dict:
    return {
        "seed": number,
        "train_seconds": seconds,
        "model": {"n_heads": n_heads, "d_model": d_model},
        "checkpoints": [{"step": 2000}],
    }


def results(seeds: list[dict], runs: list[dict]) -> dict:
    return {"goals": {"per_seed": seeds}, "runs": runs, "note": "by hand."}


def test_the_induction_goals_are_judged_per_seed_from_the_recipe_s_results(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_report, "RESULTS", tmp_path)
    assert verdicts.induction_goals() == []  # no results file, no rows
    seeds = [
        seed(0, 500, 0.66, 1.2, 0.05),
        seed(1, 400, 0.49, 6.8, 0.10),  # the first half's rise at the goal: not under it
        seed(2, None, 0.70, 0.1, -0.2),  # no phase change
    ]
    runs = [run(0, 80.0), run(1, 700.0), run(2, 70.0)]  # seed 1 took over 10 minutes
    (tmp_path / "induction-repeated.json").write_text(json.dumps(results(seeds, runs)))
    goals = {g.name: g for g in verdicts.induction_goals()}
    phase = goals["induction-phase-change"]
    assert phase.values == (1 / 3,) and phase.met is False  # seed 0 only, in time
    layer1 = goals["induction-layer1-head"]
    assert layer1.values == (0.66, 0.49, 0.70) and layer1.met is False
    assert layer1.measured() == "0.49 to 0.70" and layer1.goal_text() == "≥ 0.50"
    assert goals["induction-layer0-head"].met is True
    repeated = goals["induction-ablation-repeated"]
    assert repeated.values == (1.2, 6.8, 0.1) and repeated.met is False
    assert repeated.goal_text() == "≥ +1.00 nats"
    first = goals["induction-ablation-first"]
    assert first.values == (0.05, 0.10, -0.2) and first.met is False  # 0.10 is not < 0.1
    assert first.goal_text() == "< +0.10 nats" and first.measured() == "-0.20 nats to +0.10 nats"


def test_a_file_of_attempts_with_several_shapes_gets_a_heads_column_and_no_verdict(
    monkeypatch,
):
    seeds = [seed(0, 400, 0.69, 6.79, 0.01), seed(0, 400, 0.72, 0.33, 0.15)]
    attempts = results(seeds, [run(0, 140.0, n_heads=2), run(0, 150.0, n_heads=4, d_model=128)])
    monkeypatch.setattr(bench_report, "load", lambda name: attempts)
    monkeypatch.setattr(analysis, "source", lambda name, data, timed: f"Source: {name}")
    text = analysis.induction_repeated("induction-heads-attempts")
    assert text.startswith("| heads × size | seed | updates |")
    assert (
        "| 2 × 32 | 0 | 2,000 | 2.3 | 400 | 0.69 | 0.80 | L1H1 ← L0H0 0.31 ✓ | +6.79 / +0.01 "
        "| +6.79 / +0.41 | +3.00 / +0.01 | +5.00 / +0.02 (2) |"
    ) in text
    assert (
        "| 4 × 32 | 0 | 2,000 | 2.5 | 400 | 0.72 | 0.80 | L1H1 ← L0H0 0.31 ✓ | +0.33 / +0.15 |"
        in text
    )
    assert "in every seed" not in text and text.endswith("Source: induction-heads-attempts")
    single = results(seeds[:1], [run(0, 140.0, n_heads=2)])
    single["goals"].update(
        phase_change_every_seed=True,
        heads_every_seed=True,
        ablation_every_seed=True,
        pair_k_composition_every_seed=False,
    )
    monkeypatch.setattr(bench_report, "load", lambda name: single)
    text = analysis.induction_repeated()
    assert text.startswith("| seed | updates |") and "in every seed (1): **met**" in text
    assert "K-composition, in every seed (1): **not met**" in text
    assert "mean-ablating the named induction head raises" in text
