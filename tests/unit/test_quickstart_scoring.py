"""What the quickstart scores, and what its score is compared with: the weights rule
(`evaluated_weights`), and the reference line and README's table kept apart by beam,
alpha and weights rule (issue 34, item 1). A tiny corpus where the quickstart looks for
its prepared Bible: no SWORD modules needed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_quickstart_reference import run_results, write
from typer.testing import CliRunner

import aiayn.apps.quickstart
from aiayn.apps.quickstart import QuickstartConfig, Scoring, evaluated_weights, reference_line
from aiayn.cli import app
from aiayn.io.checkpoint import step_checkpoints
from benchmarks import report as bench_report
from train_helpers import tiny_quickstart

runner = CliRunner()


quickstart = tiny_quickstart


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict, str]:
    out = tmp_path_factory.mktemp("scoring") / "qs"
    return (out, *quickstart(out))


def test_the_default_scores_the_best_checkpoint_and_records_the_rule(trained):
    out, results, output = trained
    best = out / "run" / "checkpoints" / "best"
    assert Path(results["weights"]) == best / "model.safetensors"
    assert results["weights_rule"] == "best" and results["average_last"] == 1
    info = json.loads((best / "info.json").read_text(encoding="utf-8"))
    assert f"weights: {best} (the lowest validation loss, at update {info['step']:,}" in output
    assert "; the last update is 6)" in output
    assert "with beam 1, alpha 1, weights best" in output  # the reference line's scoring


def test_average_1_never_scores_an_average_left_current(tmp_path):
    """`aiayn average` makes an average that `aiayn translate RUN` prefers; the
    quickstart's --average 1 still scores the best checkpoint, as it says it does."""
    out = tmp_path / "qs"
    quickstart(out)
    averaged = runner.invoke(app, ["average", str(out / "run"), "--last", "2"])
    assert averaged.exit_code == 0, averaged.output
    results, _ = quickstart(out, "--average", "1")  # same budget: evaluates again only
    assert results["weights"] == str(out / "run/checkpoints/best/model.safetensors")
    assert results["weights_rule"] == "best"
    results, _ = quickstart(out, "--average", "2")
    assert results["weights"] == str(out / "run/checkpoints/average-last-2/model.safetensors")
    assert results["weights_rule"] == "average-last-2"


def test_without_validation_the_last_checkpoint(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained[0] / "run", run)
    shutil.rmtree(run / "checkpoints" / "best")
    said: list[str] = []
    weights, rule = evaluated_weights(run, 1, said.append)
    assert (weights, rule) == (step_checkpoints(run)[-1] / "model.safetensors", "last")
    assert said == [
        f"weights: {step_checkpoints(run)[-1]} (the last checkpoint: no validation ran)"
    ]
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        evaluated_weights(run, 1, said.append)


def test_the_reference_line_compares_only_runs_scored_the_same_way(monkeypatch, tmp_path):
    path = tmp_path / "quickstart-reference.json"
    monkeypatch.setattr(aiayn.apps.quickstart, "reference_file", lambda: path)
    entry = {"recipe": "bible-en-es-cpu.yaml", "minutes": 15, "device": "cpu"}
    entry |= {"machine": "a 2-core Xeon", "bleu": [25.0, 24.0, 26.0]}
    entry |= {"beam": 8, "alpha": 1.0, "weights": "best"}
    older = {**entry, "beam": 4, "alpha": 0.6, "weights": "average-last-3", "bleu": [18.0]}
    unrecorded = {k: v for k, v in older.items() if k not in ("beam", "alpha", "weights")}
    path.write_text(json.dumps({"references": [older, unrecorded, entry]}), encoding="utf-8")
    recipe = "x/bible-en-es-cpu.yaml"
    defaults = QuickstartConfig(device="cpu")
    assert reference_line(recipe, 15, "cpu", Scoring(defaults.beam, defaults.alpha, "best")) == (
        "reference on a 2-core Xeon: median 25.00 BLEU (range 24.00-26.00) over 3 seeds, "
        "15 minutes, beam 8, alpha 1, weights best"
    )
    paper = Scoring(4, 0.6, "average-last-3")
    assert "median 18.00 BLEU" in reference_line(recipe, 15, "cpu", paper)
    for other in (Scoring(4, 1.0, "best"), Scoring(8, 0.6, "best"), Scoring(8, 1.0, "last")):
        assert reference_line(recipe, 15, "cpu", other) == (
            "reference: none recorded yet for bible-en-es-cpu.yaml at 15 minutes on cpu "
            f"with {other.describe()}"
        )


@pytest.fixture
def report(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_report, "RESULTS", tmp_path)
    return bench_report


def test_table_and_reference_keep_beam_alpha_and_weights_apart(report, tmp_path):
    best = {"beam": 8, "alpha": 1.0, "weights": "r/checkpoints/best/model.safetensors"}
    paper = {"beam": 4, "alpha": 0.6, "weights": "r/checkpoints/average-last-3/model.safetensors"}
    for seed, bleu in ((0, 25.0), (1, 26.0)):
        write(tmp_path, f"quickstart-seed{seed}-best", run_results(seed, bleu, 45.0, **best))
    write(tmp_path, "quickstart-seed0-paper", run_results(0, 20.0, 40.0, **paper))
    recorded = {"beam": 8, "alpha": 1.0, "weights": "r/x.safetensors", "weights_rule": "last"}
    write(tmp_path, "quickstart-seed0-last", run_results(0, 24.0, 44.0, **recorded))
    old = run_results(0, 19.0, 39.0)
    for key in ("beam", "alpha", "weights"):
        del old[key]  # a file that records none of them
    write(tmp_path, "quickstart-seed0-old", old)
    rows = [line for line in report.quickstart().splitlines() if line.startswith("| bible")]
    cells = sorted(row.split(" | ")[5:9] for row in rows)
    assert cells == [
        ["4", "0.6", "average of last 3", "20.00 (20.00-20.00)"],
        ["8", "1.0", "best (valid loss)", "25.50 (25.00-26.00)"],
        ["8", "1.0", "last", "24.00 (24.00-24.00)"],
        ["?", "?", "?", "19.00 (19.00-19.00)"],
    ]
    scored = {
        (r["beam"], r["alpha"], r["weights"]): r["bleu"]
        for r in report.quickstart_reference()["references"]
    }
    assert scored == {
        (8, 1.0, "best"): [25.0, 26.0],
        (8, 1.0, "last"): [24.0],
        (4, 0.6, "average-last-3"): [20.0],
        (None, None, None): [19.0],
    }


def test_the_committed_quickstart_runs_say_how_they_were_scored():
    for entry in bench_report.quickstart_reference()["references"]:
        assert None not in (entry["beam"], entry["alpha"], entry["weights"]), entry["files"]
