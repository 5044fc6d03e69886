"""The quickstart's seed table and packaged reference, rendered by benchmarks/report.py and
the release step (benchmarks/release.py) from benchmarks/results/quickstart-*.json
(written by benchmarks/record_quickstart.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from aiayn.apps.quickstart import reference_file
from benchmarks import record_quickstart, release
from benchmarks import report as bench_report
from benchmarks.profile_train import kind_of


@pytest.fixture
def report(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_report, "RESULTS", tmp_path)
    return bench_report


def run_results(seed: int, bleu: float, chrf: float, minutes: float = 15, **extra) -> dict:
    return {
        "bleu": bleu, "chrf": chrf, "seed": seed, "minutes": minutes, "steps": 1000 + seed,
        "epochs": 2.0 + seed / 10, "device": "cpu", "recipe": "/x/bible-en-es-cpu.yaml",
        "budget": {"tokens_per_s": 10000.0 + 1000 * seed}, "beam": 8, "alpha": 1.0,
        "weights": "r/checkpoints/best/model.safetensors", **extra,
    }  # fmt: skip


def write(directory: Path, name: str, results: dict, machine: str = "Xeon, 2 cores") -> None:
    data = {"date": "2026-11-25 10:00", "machine": machine, "cpu_flags": ["avx2"]}
    data |= {"commit": "abc1234", "command": "aiayn quickstart", "results": results}
    (directory / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")


def test_no_runs_render_a_sentence_and_an_empty_reference(report):
    assert not report.has_quickstart_runs()
    assert "No quickstart run is recorded yet" in report.quickstart()
    assert report.quickstart_reference()["references"] == []


def test_table_and_reference_give_median_and_range_over_seeds(report, tmp_path):
    for seed, bleu, chrf in ((0, 20.5, 40.0), (1, 24.25, 44.5), (2, 19.0, 39.0)):
        write(tmp_path, f"quickstart-seed{seed}-15min", run_results(seed, bleu, chrf))
    write(tmp_path, "quickstart-seed0-30min", run_results(0, 23.0, 43.0, minutes=30))
    text = report.quickstart()
    rows = [line for line in text.splitlines() if line.startswith("| bible-en-es-cpu.yaml")]
    assert rows == [
        "| bible-en-es-cpu.yaml | not recorded | cpu (Xeon, 2 cores) | 15 | 0, 1, 2 | 8 | 1.0 | best (valid loss) "
        "| 20.50 (19.00-24.25) | 40.00 (39.00-44.50) | 1,001 | 2.10 | 11,000 |",
        "| bible-en-es-cpu.yaml | not recorded | cpu (Xeon, 2 cores) | 30 | 0 | 8 | 1.0 | best (valid loss) "
        "| 23.00 (23.00-23.00) | 43.00 (43.00-43.00) | 1,000 | 2.00 | 10,000 |",
    ]
    assert text.count("Source: `benchmarks/results/quickstart-") == 4
    (fifteen, thirty) = report.quickstart_reference()["references"]
    assert fifteen["seeds"] == [0, 1, 2] and fifteen["bleu"] == [20.5, 24.25, 19.0]
    assert (fifteen["recipe"], fifteen["minutes"], fifteen["device"]) == (
        "bible-en-es-cpu.yaml", 15, "cpu",
    )  # fmt: skip
    assert fifteen["machine"] == "Xeon, 2 cores" and thirty["bleu"] == [23.0]


def test_the_reference_line_reads_what_report_writes(report, tmp_path, monkeypatch):
    import aiayn.apps.quickstart

    for seed, bleu in ((0, 20.5), (1, 24.25), (2, 19.0)):
        write(tmp_path, f"quickstart-seed{seed}-15min", run_results(seed, bleu, 40.0))
    packaged = tmp_path / "reference.json"
    packaged.write_text(release.reference_text(), encoding="utf-8")
    monkeypatch.setattr(aiayn.apps.quickstart, "reference_file", lambda: packaged)
    scoring = aiayn.apps.quickstart.Scoring(8, 1.0, "best")
    line = aiayn.apps.quickstart.reference_line("bible-en-es-cpu.yaml", 15, "cpu", scoring)
    assert line == (
        "reference on Xeon, 2 cores: median 20.50 BLEU (range 19.00-24.25) over 3 seeds, "
        "15 minutes, beam 8, alpha 1, weights best"
    )


def test_the_reference_line_prefers_the_runs_recorded_on_this_machine(
    report, tmp_path, monkeypatch
):
    import aiayn.apps.quickstart

    for seed, bleu in ((0, 20.5), (1, 24.25), (2, 19.0)):
        write(tmp_path, f"quickstart-seed{seed}-15min", run_results(seed, bleu, 40.0))
    for seed, bleu in ((0, 26.0), (1, 25.5)):
        write(tmp_path, f"quickstart-amd-{seed}", run_results(seed, bleu, 40.0), "EPYC, 2 cores")
    packaged = tmp_path / "reference.json"
    packaged.write_text(release.reference_text(), encoding="utf-8")
    monkeypatch.setattr(aiayn.apps.quickstart, "reference_file", lambda: packaged)
    scoring = aiayn.apps.quickstart.Scoring(8, 1.0, "best")

    def line(machine):
        return aiayn.apps.quickstart.reference_line(
            "bible-en-es-cpu.yaml", 15, "cpu", scoring, machine=machine
        )

    assert line("EPYC, 2 cores").startswith("reference on EPYC, 2 cores: median 25.75 BLEU")
    assert line("Xeon, 2 cores").startswith("reference on Xeon, 2 cores: median 20.50 BLEU")
    first = report.quickstart_reference()["references"][0]["machine"]
    assert line("another CPU, 2 cores").startswith(f"reference on {first}:")  # none of its own


def test_runs_of_another_version_of_the_recipe_are_kept_apart(report, tmp_path, monkeypatch):
    import aiayn.apps.quickstart
    from aiayn.apps.quickstart import recipe_digest

    recipe = tmp_path / "bible-en-es-cpu.yaml"
    recipe.write_text("train: {warmup: 400}\n", encoding="utf-8")
    old = recipe_digest(recipe)
    recipe.write_text("train: {warmup: 200}\n", encoding="utf-8")
    new = recipe_digest(recipe)
    assert len(new) == 12 and old != new and recipe_digest(tmp_path / "missing.yaml") is None
    for seed, bleu, digest in ((0, 20.0, old), (1, 21.0, old), (0, 25.0, new)):
        write(
            tmp_path,
            f"quickstart-v{digest}-{seed}",
            run_results(seed, bleu, 40.0, recipe_sha256=digest),
        )
    monkeypatch.setattr(report, "ROOT", tmp_path / "root")
    packaged_dir = tmp_path / "root" / "src" / "aiayn" / "config" / "recipes"
    packaged_dir.mkdir(parents=True)
    (packaged_dir / "bible-en-es-cpu.yaml").write_bytes(recipe.read_bytes())
    rows = [line for line in report.quickstart().splitlines() if line.startswith("| bible")]
    assert [row.split(" | ")[1] for row in rows] == [f"`{new[:8]}` (current)", f"`{old[:8]}`"]
    packaged = tmp_path / "reference.json"
    packaged.write_text(release.reference_text(), encoding="utf-8")
    monkeypatch.setattr(aiayn.apps.quickstart, "reference_file", lambda: packaged)
    line = aiayn.apps.quickstart.reference_line(
        recipe, 15, "cpu", aiayn.apps.quickstart.Scoring(8, 1.0, "best")
    )
    assert "median 25.00 BLEU" in line and "over 1 seed" in line  # the old version's runs left out


def test_the_packaged_reference_equals_what_the_release_step_writes():
    # A run recorded without `python -m benchmarks.release` leaves the packaged file stale.
    assert reference_file() == release.REFERENCE
    assert reference_file().read_text(encoding="utf-8") == release.reference_text()


def test_record_copies_results_with_provenance_and_the_command(monkeypatch, tmp_path):
    record = record_quickstart
    monkeypatch.setattr(record.common, "RESULTS", tmp_path / "results")
    run = tmp_path / "run"
    run.mkdir()
    results = run_results(
        2, 21.0, 41.0, overrides=["train.lr_scale=2"], average_last=5, date="2026-11-20"
    )
    (run / "results.json").write_text(json.dumps(results), encoding="utf-8")
    written = record.record(run, "quickstart-seed2-15min")
    data = json.loads(written.read_text(encoding="utf-8"))
    assert data["results"] == results
    for key in ("date", "machine", "cpu_flags", "versions", "commit"):
        assert key in data, key
    assert data["date"] == "2026-11-20"  # the run's, not the recording's
    assert "load_average" not in data and "load" not in data  # not the run's load
    assert shlex.split(data["command"]) == [
        "aiayn", "quickstart", "--minutes", "15", "--seed", "2", "--device", "cpu",
        "--set", "train.lr_scale=2", "--average", "5",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="must start with 'quickstart-'"):
        record.record(run, "seed2")
    with pytest.raises(FileNotFoundError, match=r"no results\.json"):
        record.record(tmp_path, "quickstart-x")
    del results["seed"]
    (run / "results.json").write_text(json.dumps(results), encoding="utf-8")
    with pytest.raises(ValueError, match="has no seed"):
        record.record(run, "quickstart-x")


def test_train_profile_table_from_a_results_file(report, tmp_path):
    kinds = [
        {"kind": "matmul / linear", "ms_per_step": 150.0, "percent": 60.0},
        {"kind": "other / Python", "ms_per_step": 100.0, "percent": 40.0},
    ]
    peak = {"gflops": 200.0, "shape": [1024, 1024, 1024], "threads": 2, "percent_reached": 25.0}
    data = {"date": "2026-11-25", "machine": "Xeon, 2 cores", "cpu_flags": ["avx2"]}
    data |= {"commit": "abc1234", "command": "profile_train.py", "recipe": "bible-en-es-cpu.yaml"}
    data |= {"steps": 30, "warmup": 10, "ms_per_step": 250.0, "tgt_tokens_per_step": 2000.0}
    data |= {"tgt_tokens_per_s": 8000.0, "achieved_gflops": 50.0, "matmul_flops_per_step": 1.25e10}
    data |= {"kinds": kinds, "peak": {"float32": peak}}
    (tmp_path / "train-profile.json").write_text(json.dumps(data), encoding="utf-8")
    text = report.train_profile()
    assert "| matmul / linear | 150.00 | 60.0% |" in text
    assert "| **a step** | **250.00** | 100% |" in text
    assert "50.0 GFLOP/s of matrix products (12.5 GFLOP a step" in text
    assert "25.0% of the float32 peak (200 GFLOP/s on 1024x1024x1024, 2 threads)" in text
    assert "Source: `benchmarks/results/train-profile.json`" in text


class Event:
    def __init__(self, name: str, parent: Event | None = None) -> None:
        self.name, self.cpu_parent = name, parent


def test_profile_kinds_by_name_then_by_caller():
    step = Event("aiayn.step")
    backward = Event("autograd::engine::evaluate_function: AddmmBackward0", step)
    assert kind_of(Event("aten::mm", backward)) == "matmul / linear"
    assert kind_of(Event("aten::_scaled_dot_product_flash_attention_for_cpu", step)) == (
        "attention (SDPA)"
    )
    loss = Event("aiayn.training.loss", step)
    assert kind_of(Event("aten::mul", loss)) == "softmax + loss"
    assert kind_of(Event("aten::_log_softmax_backward_data", step)) == "softmax + loss"
    assert kind_of(Event("aten::add_", Event("Optimizer.step#AdamW.step", step))) == "optimizer"
    assert kind_of(Event("aten::copy_", Event("aiayn.data", step))) == "data"
    assert kind_of(Event("aten::native_layer_norm_backward", step)) == "layer norm"
    assert kind_of(Event("aten::embedding_dense_backward", step)) == "embedding"
    assert kind_of(Event("aten::native_dropout", step)) == "dropout"
    assert kind_of(Event("aten::relu", step)) == "elementwise"
    assert kind_of(backward) == "other / Python"


def test_runs_with_overrides_form_their_own_row_and_reference(report, tmp_path):
    write(tmp_path, "quickstart-seed0-15min", run_results(0, 18.0, 38.0))
    auto = run_results(0, 19.0, 39.0, overrides=["train.precision=auto"])
    write(tmp_path, "quickstart-bf16-seed0-15min", auto)
    rows = [line for line in report.quickstart().splitlines() if line.startswith("| bible")]
    assert rows[0].startswith(
        "| bible-en-es-cpu.yaml | not recorded | cpu (Xeon, 2 cores) | 15 | 0 | 8 | "
    )
    assert "| 18.00 " in rows[0]
    assert rows[1].startswith(
        "| bible-en-es-cpu.yaml `train.precision=auto` | not recorded | cpu (Xeon, 2 cores) | 15 | 0 | 8 | "
    )
    assert "| 19.00 " in rows[1]
    plain, bf16 = report.quickstart_reference()["references"]
    assert plain["overrides"] == [] and plain["bleu"] == [18.0]
    assert bf16["overrides"] == ["train.precision=auto"] and bf16["bleu"] == [19.0]
