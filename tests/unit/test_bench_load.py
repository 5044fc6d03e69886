"""Benchmarks under load: benchmarks/common.py records the load average before and after
a run's timed part and the run's own start, marks a run whose other work came above 0.75
of a core per core, and benchmarks/report shows that mark under the run's tables."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time

import pytest

import benchmarks
from benchmarks import common
from benchmarks import report as bench_report
from benchmarks.report import engine


def _common_started(monkeypatch, load: tuple[float, float, float], at: str):
    """benchmarks/common.py imported afresh at time `at` under 1, 5, 15-minute load `load`,
    as a benchmark imports it when it starts (the module imported before is put back after
    the test)."""
    real_strftime = time.strftime
    monkeypatch.setattr(os, "getloadavg", lambda: load)
    monkeypatch.setattr(time, "strftime", lambda fmt, *rest: at)
    monkeypatch.delitem(sys.modules, "benchmarks.common", raising=False)
    monkeypatch.setattr(benchmarks, "common", None, raising=False)
    module = importlib.import_module("benchmarks.common")
    monkeypatch.setattr(time, "strftime", real_strftime)
    return module


@pytest.mark.parametrize(
    ("before", "after", "threads", "cores", "noisy"),
    [
        (0.5, 2.4, 2, 2, False),  # after: 2.4 less its own 2 threads is 0.4 of other work
        (1.4, 1.5, None, 2, False),  # at the limit of 0.75 x 2 cores is not above it
        (1.6, 2.0, 2, 2, True),  # other work before the run
        (0.2, 3.6, 2, 2, True),  # other work came during it: 3.6 - 2 = 1.6
        (0.2, 1.6, None, 2, True),  # no thread count: all of the load counts
        (5.0, 7.0, 2, 8, False),  # the limit scales with the cores: 6 on 8
        (6.1, 7.0, 2, 8, True),
    ],
)
def test_load_record_marks_other_work_above_three_quarters_of_the_cores(
    monkeypatch, before, after, threads, cores, noisy
):
    common = _common_started(monkeypatch, (0.0, 0.0, 0.0), "2026-01-01 00:00")
    record = common.load_record([before, 1.0, 1.0], [after, 1.0, 1.0], threads, cores)
    assert record["noisy"] is noisy
    assert record["limit"] == pytest.approx(0.75 * cores)
    assert record["before"][0] == before and record["after"][0] == after


def test_load_record_without_a_load_or_cores_marks_nothing(monkeypatch):
    common = _common_started(monkeypatch, (0.0, 0.0, 0.0), "2026-01-01 00:00")
    assert common.load_record(None, [9.0, 9.0, 9.0], 1, 2)["noisy"] is None
    assert common.load_record([9.0, 9.0, 9.0], None, 1, 2)["noisy"] is None
    assert common.load_record([9.0, 9.0, 9.0], [9.0, 9.0, 9.0], 1, None)["noisy"] is None


@pytest.mark.parametrize(
    ("payload", "threads"),
    [
        ({"args": {"threads": 2}}, 2),
        ({"args": {"threads": "2,1"}}, 2),  # bench_decode's --threads 2,1
        ({"args": {"threads": "1"}}, 1),  # bench_attention saves its args as text
        ({"threads": 1, "args": {"rounds": 3}}, 1),  # bench_serve keeps it at the top
        ({"args": {"rounds": 3}}, None),
        ({}, None),
    ],
)
def test_the_threads_of_a_payload(monkeypatch, payload, threads):
    common = _common_started(monkeypatch, (0.0, 0.0, 0.0), "2026-01-01 00:00")
    assert common.recorded_threads(payload) == threads


def test_a_results_file_records_the_runs_start_and_its_load_and_warns(
    monkeypatch, tmp_path, capsys
):
    common = _common_started(monkeypatch, (1.9, 1.2, 0.8), "2026-01-01 10:00")
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.5, 2.0, 1.0))  # when the run ends
    path = common.write_json("noisy", {"args": {"threads": 1}, "results": []})
    data = json.loads(path.read_text())
    assert data["date"] == "2026-01-01 10:00"  # its start, not the time of writing
    assert data["load"] == {
        "before": [1.9, 1.2, 0.8],
        "after": [2.5, 2.0, 1.0],
        "threads": 1,
        "cores": 2,
        "limit": 1.5,
        "noisy": True,
    }
    assert data["load_average"] == [2.5, 2.0, 1.0]
    err = capsys.readouterr().err
    assert "warning: load average 1.9 before and 2.5 after the timed part" in err
    assert "above 1.5 for 2 cores" in err
    common.write_json("noisy-again", {"args": {"threads": 1}})
    assert capsys.readouterr().err == ""  # said once per run


def test_a_quiet_run_is_recorded_quiet_without_a_warning(monkeypatch, tmp_path, capsys):
    common = _common_started(monkeypatch, (0.3, 0.2, 0.1), "2026-01-01 10:00")
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.2, 1.0, 0.5))  # its own 2 threads
    data = json.loads(common.write_json("quiet", {"args": {"threads": "2,1"}}).read_text())
    assert data["load"]["noisy"] is False and data["load"]["threads"] == 2
    assert "warning" not in capsys.readouterr().err


# ----- the report: the mark under a table -------------------------------------------------

SERVE = {
    "beam": 4,
    "max_wait_ms": 5,
    "threads": 1,
    "rounds": 4,
    "cells": [
        {
            "clients": 1,
            "server": "batching",
            "sentences_per_s": 10.0,
            "p50_ms": 100.0,
            "p95_ms": 120.0,
            "p99_ms": 130.0,
            "mean_batch": 1.0,
            "refused_429": 0,
            "speedup": 1.0,
        }
    ],
    "date": "2026-01-01 10:00",
    "machine": "AMD EPYC, 2 cores",
}
NOISY = {"before": [1.9, 1.2, 0.8], "after": [2.5, 2.0, 1.0], "threads": 1, "cores": 2}
NOISY.update(limit=1.5, noisy=True)
QUIET = {**NOISY, "before": [0.3, 0.2, 0.1], "after": [1.2, 1.0, 0.5], "noisy": False}


@pytest.fixture
def report(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_report, "RESULTS", tmp_path)
    return bench_report


def _serve_table(report, tmp_path, **provenance) -> str:
    (tmp_path / "serve.json").write_text(json.dumps({**SERVE, **provenance}))
    return engine.serve("serve")


def test_a_noisy_file_is_marked_under_its_table(report, tmp_path):
    text = _serve_table(report, tmp_path, load=NOISY, load_average=NOISY["after"])
    assert "load average 1.9 before and 2.5 after its timed part" in text
    mark = text.splitlines()[-1]
    assert mark.startswith("**Measured under load:** load average 1.9 before and 2.5 after")
    assert "above 1.5 for 2 cores" in mark
    # the mark goes with the file wherever it is shown, not only under serve and generate
    assert report.load_mark({"load": NOISY}, needs_quiet=False) == mark


def test_a_quiet_file_is_not_marked(report, tmp_path):
    text = _serve_table(report, tmp_path, load=QUIET, load_average=QUIET["after"])
    assert "load average 0.3 before and 1.2 after its timed part" in text
    assert text.splitlines()[-1].startswith("Source: ")
    assert "under load" not in text and "Load not recorded" not in text


def test_an_old_file_without_a_load_record(report, tmp_path):
    text = _serve_table(report, tmp_path, load_average=[1.2, 1.5, 2.0])
    assert "load average 1.2 at its end" in text
    assert text.splitlines()[-1] == (
        "**Load not recorded** before the timed part (1.2 at its end, its own threads "
        "included): these figures are not known to come from a quiet machine."
    )
    # tables of ratios measured in turns are not marked for a load they do not record
    assert report.load_mark({"load_average": [1.2, 1.5, 2.0]}) is None


def test_an_old_file_whose_end_load_less_its_threads_passes_the_limit_is_marked(report, tmp_path):
    """Issue 48: train.json (load 9.19 at its end, 1 thread of its own) carried no mark.
    9.19 - 1 > 0.75 x 2 cores; 2.2 - 1 is not; a file that does not say its threads is
    not judged (its own load is unknown)."""
    data = {"load_average": [9.19, 5.0, 3.0], "machine": "AMD EPYC, 2 cores", "threads": 1}
    mark = report.load_mark(data)
    assert mark == (
        "**Measured under load:** load average 9.19 at its end (1 thread(s) of its own), "
        "above 1.5 for 2 cores; the file has no record from before its timed part, and the "
        "figures may be lower than on a quiet machine."
    )
    assert report.load_mark({**data, "load_average": [2.2, 1.0, 1.0]}) is None
    assert report.load_mark({**data, "threads": None}) is None
    text = _serve_table(report, tmp_path, load_average=[2.68, 3.07, 4.56])
    assert text.splitlines()[-1].startswith("**Measured under load:** load average 2.68 at its end")


def test_a_files_own_note_is_on_its_source_line(report):
    """Issue 48, item 15: efficient-bible-genre.json's command names the file it was
    written as (`--results efficient-bible-genre-5min`); its note says it was renamed."""
    data = {"date": "2026-11-26 01:21", "command": "bench --results old-name"}
    line = report.source("x", {**data, "file_note": "written as old-name.json and renamed."})
    assert (
        "`bench --results old-name`. The file's note: written as old-name.json and renamed." in line
    )
    assert "note" not in report.source("x", data)


def test_the_commit_is_changed_by_code_but_not_by_results_files(monkeypatch, tmp_path):
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "run.json").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    monkeypatch.delenv("AIAYN_BENCH_COMMIT", raising=False)
    monkeypatch.setattr(common, "ROOT", tmp_path)
    head = common.commit()
    assert head and "+" not in head
    (tmp_path / "benchmarks" / "results" / "run.json").write_text('{"new": 1}\n')
    assert common.commit() == head  # a run's own output is no change to what it measured
    (tmp_path / "code.py").write_text("x = 2\n")
    assert common.commit() == head + "+changes"
