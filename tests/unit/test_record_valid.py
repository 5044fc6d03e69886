"""benchmarks/record_valid.py: its search list, the best validation loss it reads, and
the report's grouping of runs by recipe version and overrides."""

from __future__ import annotations

import json

import pytest

from benchmarks.record_valid import best_valid_loss, parse_searches
from benchmarks.report import group_label, median_span, valid_bleu, valid_runs


def test_searches_are_beam_alpha_pairs():
    assert parse_searches("1:0,4:0.6,8:1.0") == [(1, 0.0), (4, 0.6), (8, 1.0)]
    for bad in ("8", "0:1.0", "x:1", "4:-0.5", "4:1,"):
        with pytest.raises(ValueError, match="--searches"):
            parse_searches(bad)


def test_the_best_validation_loss_is_the_lowest_logged(tmp_path):
    assert best_valid_loss(tmp_path) is None  # no metrics.jsonl
    records = [
        {"kind": "train", "step": 50, "loss": 1.0},
        {"kind": "valid", "step": 400, "loss": 3.25},
        {"kind": "valid", "step": 800, "loss": 2.512345},
        {"kind": "valid", "step": 900, "loss": 2.9},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert best_valid_loss(tmp_path) == 2.5123


def run(seed, overrides, scores, digest="6d97618d6bd9"):
    searches = [{"beam": b, "alpha": a, "bleu": v} for (b, a), v in scores.items()]
    return {"seed": seed, "overrides": overrides, "searches": searches, "recipe_sha256": digest}


def test_runs_group_by_their_overrides_and_scores_are_found_by_search():
    data = {
        "runs": [
            run(0, [], {(8, 1.0): 24.7, (1, 0.0): 21.0}),
            run(1, [], {(8, 1.0): 24.6, (1, 0.0): 21.1}),
            run(0, ["model.dropout=0.1"], {(8, 1.0): 22.4}),
        ]
    }
    groups = valid_runs(data)
    recipe, dropout = ("6d97618d6bd9", ()), ("6d97618d6bd9", ("model.dropout=0.1",))
    assert [r["seed"] for r in groups[recipe]] == [0, 1]
    assert [r["seed"] for r in groups[dropout]] == [0]
    assert valid_bleu(groups[recipe][1], 8, 1.0) == 24.6
    assert valid_bleu(groups[dropout][0], 1, 0.0) is None
    assert group_label(recipe, 1) == "the recipe"
    assert group_label(dropout, 1) == "`model.dropout=0.1`"
    assert median_span([24.7]) == "24.70"
    assert median_span([24.7, 24.6, 26.0]) == "24.70 (24.60-26.00)"


def test_two_versions_of_the_recipe_file_are_two_groups_labelled_by_digest():
    data = {
        "runs": [
            run(0, [], {(8, 1.0): 24.7}),
            run(0, [], {(8, 1.0): 25.9}, digest="2f55522f87ad"),
            run(1, [], {(8, 1.0): 24.6}),
        ]
    }
    groups = valid_runs(data)
    assert [len(runs) for runs in groups.values()] == [2, 1]
    assert group_label(("2f55522f87ad", ()), len(groups)) == "the recipe, version 2f55522f"
