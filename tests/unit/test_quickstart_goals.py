"""Issue 45's goal rows in the report's goals table (benchmarks/report/verdicts.py
`other_goals`): the quickstart's BLEU over seeds (a median of 26, no seed under 25), its
step's share of the faster precision's matmul peak, and its step's speed-up against the
commit before issue 45, from hand-made results files of record_quickstart's and
train_step_race's shapes."""

from __future__ import annotations

import json

from benchmarks import record_valid
from benchmarks import report as bench_report
from benchmarks.bench_quality_seeds import seeds
from benchmarks.record_quickstart import measured
from benchmarks.report import verdicts
from benchmarks.report.runs import packaged_digest

RECIPE = "bible-en-es-cpu.yaml"


def quickstart(seed: int, bleu: float, fp32_share: float, bf16_share: float) -> dict:
    peak = {
        "float32": {"gflops": 170.0, "percent_reached": fp32_share},
        "bfloat16": {"gflops": 700.0, "percent_reached": bf16_share},
    }
    return {
        "machine": "a test machine",
        "results": {
            "recipe": RECIPE,
            "recipe_sha256": packaged_digest(RECIPE),
            "minutes": 15,
            "device": "cpu",
            "overrides": [],
            "beam": 8,
            "alpha": 1.0,
            "weights_rule": "best",
            "seed": seed,
            "bleu": bleu,
            "chrf": 50.0,
            "budget": {"peak": peak},
        },
    }


def test_the_quickstart_goals_come_from_the_recorded_seeds_and_the_step_race(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_report, "RESULTS", tmp_path)
    assert {g.name for g in verdicts.other_goals()} == set()  # no results files, no rows
    runs = [(0, 26.4, 101.0, 24.0), (1, 24.9, 99.0, 23.5), (2, 26.1, 100.0, 24.5)]
    for seed, bleu, fp32, bf16 in runs:
        record = quickstart(seed, bleu, fp32, bf16)
        (tmp_path / f"quickstart-seed{seed}.json").write_text(json.dumps(record))
    race = {
        "against": "4f6d1db",
        "rounds": 7,
        "speedup_median": 1.496,
        "sides": {"this checkout": {"precision": "Precision.BF16"}},
    }
    (tmp_path / "train-step-vs-4f6d1db.json").write_text(json.dumps(race))
    goals = {g.name: g for g in verdicts.other_goals()}
    median = goals["quickstart-bleu"]
    assert median.values == (26.4, 24.9, 26.1) and median.met is True  # median 26.1
    assert median.goal_text() == "≥ 26.00 BLEU"
    floor = goals["quickstart-bleu-floor"]
    assert floor.met is False and floor.goal_text() == "≥ 25.00 BLEU"  # seed 1: 24.9
    peak = goals["quickstart-peak"]  # of the faster precision's peak: bf16's, the lower share
    assert peak.values == (0.24, 0.235, 0.245) and peak.met is False
    assert peak.goal_text() == "50%" and peak.measured() == "23.5% to 24.5%"
    step = goals["quickstart-step"]
    assert step.values == (1.496,) and step.met is False and step.precision == "bf16"
    assert step.goal_text() == "1.5x"


def test_each_machine_recorded_gets_its_own_quickstart_rows(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_report, "RESULTS", tmp_path)
    for seed, bleu in ((0, 25.6), (1, 25.5), (2, 25.4)):
        record = quickstart(seed, bleu, 87.0, 20.0)
        (tmp_path / f"quickstart-seed{seed}.json").write_text(json.dumps(record))
    for seed, bleu in ((0, 26.2), (1, 25.9), (2, 26.1)):
        record = quickstart(seed, bleu, 37.0, 12.0) | {"machine": "another machine"}
        (tmp_path / f"quickstart-other-seed{seed}.json").write_text(json.dumps(record))
    goals = {g.name: g for g in verdicts.other_goals()}
    first, second = goals["quickstart-bleu"], goals["quickstart-bleu-2"]
    assert {first.work, second.work} == {
        f"the quickstart, {RECIPE} as packaged, 15 minutes on a test machine",
        f"the quickstart, {RECIPE} as packaged, 15 minutes on another machine",
    }
    by_machine = {g.work.rsplit(" on ", 1)[1]: g for g in (first, second)}
    assert by_machine["a test machine"].met is False  # median 25.5
    assert by_machine["another machine"].met is True  # median 26.1
    assert goals["quickstart-peak-2"].values in ((0.2,) * 3, (0.12,) * 3)


def test_the_writers_give_each_record_its_measures_line():
    # the report refuses a results file without a `measures` record (system, cell, harness)
    run = quickstart(1, 25.5, 100.0, 24.0)["results"]
    run["overrides"] = ["train.precision=fp32"]
    assert measured(run) == {
        "system": "aiayn quickstart: test BLEU and chrF after training",
        "cell": f"{RECIPE} version {packaged_digest(RECIPE)[:8]}, 15 minutes, seed 1, cpu, "
        "train.precision=fp32",
        "harness": "record_quickstart",
    }
    assert seeds([{"seed": 2}, {"seed": 0}, {"seed": 1}]) == "0 to 2"
    assert seeds([{"seed": 0}, {"seed": 3}]) == "0, 3"
    assert seeds([{"seed": None}]) == "not recorded"
    assert record_valid.minutes([{"minutes": 15.0}, {"minutes": 15.0}]) == "15 minutes"
    assert record_valid.minutes([{"minutes": 15.0}, {"minutes": 30.0}]) == "15 to 30 minutes"
