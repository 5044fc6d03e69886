"""aiayn.apps.decoder_choice: `aiayn translate` and `aiayn serve` default to the decoder
measured faster, never to a fixed one.

The measurements are faked (results files written here): a machine that reports the
engine slower does not get it, one that reports it faster does, and what the chosen
path writes equals what the other writes (fp32: the same arithmetic).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import aiayn.apps.serve
import aiayn.apps.translate as translate_app
from aiayn.apps.decoder_choice import (
    MEASURED,
    SPEEDS_VARIABLE,
    DecoderSpeed,
    Use,
    choose_decoder,
    default_decoder,
    speeds_from_results,
)
from aiayn.cli import app
from aiayn.inference.engine import Engine
from infer_helpers import make_run, sentences

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
COMMITTED = (
    "translate.json",
    "translate-beam4-1thread.json",
    "serve-dynamic.json",
    "serve-continuous-groups.json",
)


def file_results(path: Path, beam: int, threads: int, speeds: dict[str, float]) -> Path:
    """A results file as bench_translate writes it: a cell per system."""
    cells = [
        dict(system=system, threads=threads, sentences_per_s=speed)
        for system, speed in speeds.items()
    ]
    path.write_text(json.dumps(dict(beam=beam, cells=cells)), encoding="utf-8")
    return path


def serve_results(path: Path, continuous: int, by_clients: dict[int, float]) -> Path:
    """A results file as bench_serve writes it (beam 4, 1 thread), with its baseline."""
    cells = []
    for clients, speed in by_clients.items():
        cells.append(dict(server="batching", clients=clients, sentences_per_s=speed))
        cells.append(dict(server="one at a time", clients=clients, sentences_per_s=1.0))
    data = dict(beam=4, threads=1, continuous=continuous or None, cells=cells)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_measured_is_what_the_committed_results_files_say():
    read = [speed for name in COMMITTED for speed in speeds_from_results(RESULTS / name)]
    assert sorted(read, key=repr) == sorted(MEASURED, key=repr)


def test_the_committed_results_keep_todays_plain_defaults():
    # translate.json: batches 56.1 against the engine's 56.8 at beam 8, 2 threads, a gain
    # within the margin; serve: the dynamic batcher 59.2 against 47.8 at 64 clients
    for beam, threads in ((8, 2), (4, 1), (1, 2)):
        assert choose_decoder(Use.FILE, beam, threads).continuous == 0
    assert "(within 5%: the same outputs)" in choose_decoder(Use.FILE, 8, 2).reason
    choice = choose_decoder(Use.SERVE, 4, 1)
    assert choice.continuous == 0
    assert "59.2 sentences/s against 47.8 for the continuous engine (32 at once)" in choice.reason
    assert "64 clients" in choice.reason


def test_the_engine_must_beat_the_plain_path_by_the_margin(tmp_path):
    # 40 x 1.05 = 42: just below keeps sorted batches, at the margin takes the engine
    near = file_results(tmp_path / "a.json", 4, 2, {"batches": 40.0, "continuous-32": 41.9})
    enough = file_results(tmp_path / "b.json", 4, 2, {"batches": 40.0, "continuous-32": 42.0})
    kept = choose_decoder(Use.FILE, 4, 2, speeds_from_results(near))
    assert kept.continuous == 0
    assert kept.reason == (
        "sorted batches, 40.0 sentences/s against 41.9 for the continuous engine (32 at "
        "once) (within 5%: the same outputs) at beam 4, 2 threads (a.json)"
    )
    assert choose_decoder(Use.FILE, 4, 2, speeds_from_results(enough)).continuous == 32


def test_a_machine_reporting_the_engine_slower_does_not_get_it_and_faster_does(tmp_path):
    slower = file_results(tmp_path / "a.json", 4, 2, {"batches": 40.0, "continuous-32": 30.0})
    faster = file_results(tmp_path / "b.json", 4, 2, {"batches": 40.0, "continuous-32": 50.0})
    assert choose_decoder(Use.FILE, 4, 2, speeds_from_results(slower)).continuous == 0
    choice = choose_decoder(Use.FILE, 4, 2, speeds_from_results(faster))
    assert choice.continuous == 32
    assert choice.reason == (
        "the continuous engine (32 at once), 50.0 sentences/s against 40.0 for sorted "
        "batches at beam 4, 2 threads (b.json)"
    )
    # the fastest of several engine sizes; a tie keeps the plain path
    several = {"batches": 40.0, "continuous-8": 45.0, "continuous-16": 60.0}
    speeds = speeds_from_results(file_results(tmp_path / "c.json", 4, 2, several))
    assert choose_decoder(Use.FILE, 4, 2, speeds).continuous == 16
    tie = file_results(tmp_path / "d.json", 4, 2, {"batches": 40.0, "continuous-8": 40.0})
    assert choose_decoder(Use.FILE, 4, 2, speeds_from_results(tie)).continuous == 0


def test_only_float32_batches_and_engines_are_read_from_a_file_race(tmp_path):
    # bench_translate's other systems (compiled, another dtype, an earlier commit, the
    # default) are not decoders to choose between: they are skipped, not misread
    race = {
        "batches": 40.0,
        "continuous-32": 30.0,
        "continuous-compiled-32": 90.0,
        "continuous-32:bfloat16": 80.0,
        "batches:int8": 70.0,
        "batches@4900a20": 20.0,
        "default": 60.0,
    }
    speeds = speeds_from_results(file_results(tmp_path / "race.json", 8, 2, race))
    assert sorted((s.continuous, s.sentences_per_s) for s in speeds) == [(0, 40.0), (32, 30.0)]
    assert choose_decoder(Use.FILE, 8, 2, speeds).continuous == 0


def test_the_nearest_measured_setting_decides():
    def speed(continuous: int, beam: int, threads: int, value: float, clients: int = 0):
        use = Use.SERVE if clients else Use.FILE
        return DecoderSpeed(use, continuous, beam, threads, value, clients, "x.json")

    # the engine wins at beam 8 and loses at beam 4: the beam asked for picks the setting
    speeds = [speed(0, 8, 2, 10.0), speed(16, 8, 2, 20.0), speed(0, 4, 2, 30.0)]
    speeds.append(speed(16, 4, 2, 25.0))
    assert choose_decoder(Use.FILE, 8, 2, speeds).continuous == 16
    assert choose_decoder(Use.FILE, 4, 2, speeds).continuous == 0
    assert choose_decoder(Use.FILE, 1, 2, speeds).continuous == 0  # nearest beam: 4
    assert choose_decoder(Use.FILE, 7, 1, speeds).continuous == 16  # nearest beam: 8
    # then the same threads
    speeds = [speed(0, 4, 1, 10.0), speed(16, 4, 1, 20.0), speed(0, 4, 2, 30.0)]
    speeds.append(speed(16, 4, 2, 25.0))
    assert choose_decoder(Use.FILE, 4, 1, speeds).continuous == 16
    assert choose_decoder(Use.FILE, 4, 2, speeds).continuous == 0
    # a server: its throughput under the most clients measured
    served = [speed(0, 4, 1, 20.0, 4), speed(32, 4, 1, 25.0, 4)]
    served += [speed(0, 4, 1, 60.0, 64), speed(32, 4, 1, 48.0, 64)]
    assert choose_decoder(Use.SERVE, 4, 1, served).continuous == 0
    assert choose_decoder(Use.SERVE, 4, 1, served[:2]).continuous == 32


def test_without_a_comparison_the_plain_path_stays():
    only_engine = [DecoderSpeed(Use.FILE, 32, 4, 1, 99.0, 0, "x.json")]
    choice = choose_decoder(Use.FILE, 4, 1, only_engine)
    assert choice.continuous == 0 and "only the continuous engine (32 at once)" in choice.reason
    nothing = choose_decoder(Use.SERVE, 4, 1, only_engine)  # a file's measurement only
    assert nothing.continuous == 0 and "no decoder measured for a serve" in nothing.reason


def test_default_decoder_logs_one_line_and_keeps_the_engine_from_what_it_cannot_run(
    tmp_path, monkeypatch, caplog
):
    faster = file_results(tmp_path / "b.json", 4, 1, {"batches": 40.0, "continuous-32": 50.0})
    monkeypatch.setenv(SPEEDS_VARIABLE, str(faster))
    with caplog.at_level(logging.INFO, logger="aiayn.apps.decoder_choice"):
        assert default_decoder(Use.FILE, 4, 1).continuous == 32
    assert [r.getMessage() for r in caplog.records] == [
        "decoder for a file: the continuous engine (32 at once), 50.0 sentences/s against "
        "40.0 for sorted batches at beam 4, 1 thread (b.json)"
    ]
    assert default_decoder(Use.FILE, 4, 1, shortlist=True).continuous == 0
    assert default_decoder(Use.FILE, 4, 1, device="cuda:0").continuous == 0


def test_a_bad_speeds_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(SPEEDS_VARIABLE, str(tmp_path / "gone.json"))
    with pytest.raises(FileNotFoundError, match=r"gone\.json, which does not exist"):
        choose_decoder(Use.FILE, 4, 1)
    (tmp_path / "bad.json").write_text('{"cells": [{"server": "batching"}]}', encoding="utf-8")
    monkeypatch.setenv(SPEEDS_VARIABLE, str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match=r"bad.json is no results file .*AIAYN_DECODER_SPEEDS"):
        choose_decoder(Use.FILE, 4, 1)


# ----- the CLI's defaults ------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("choice"))


def test_cli_translate_runs_the_engine_only_where_it_was_measured_faster(
    tmp_path, run, monkeypatch
):
    started = []

    class Recording(Engine):
        def __init__(self, *args, **kwargs) -> None:
            started.append(args[2])  # sentences at once
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(translate_app, "Engine", Recording)
    source = tmp_path / "in.txt"
    source.write_text("\n".join(sentences(12, seed=7)) + "\n", encoding="utf-8")
    threads = torch.get_num_threads()
    outputs = {}
    for name, engine_speed in (("slower", 30.0), ("faster", 50.0)):
        speeds = {"batches": 40.0, "continuous-4": engine_speed}
        monkeypatch.setenv(SPEEDS_VARIABLE, str(file_results(tmp_path / name, 4, threads, speeds)))
        args = ["translate", str(run), "-i", str(source), "--extra-len", "6"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        outputs[name] = result.stdout.splitlines()
        assert started == ([] if name == "slower" else [4])
    assert len(outputs["slower"]) == 12 and len(set(outputs["slower"])) > 4
    assert outputs["faster"] == outputs["slower"]  # fp32: the engine writes what batches do
    # an explicit --continuous 0 is obeyed whatever was measured
    result = CliRunner().invoke(app, [*args, "--continuous", "0"])
    assert result.exit_code == 0 and started == [4]


def test_cli_serve_defaults_to_the_server_measured_faster(tmp_path, run, monkeypatch):
    chosen = []

    def fake_app(translator, settings, source):
        chosen.append(settings.continuous)
        return object()

    monkeypatch.setattr(aiayn.apps.serve, "create_app", fake_app)
    monkeypatch.setattr(aiayn.apps.serve, "run_server", lambda *args: None)
    dynamic = serve_results(tmp_path / "dynamic.json", 0, {4: 20.0, 64: 59.0})
    for engine_speed, expected in ((48.0, 0), (70.0, 32)):
        engine = serve_results(tmp_path / "engine.json", 32, {4: 25.0, 64: engine_speed})
        monkeypatch.setenv(SPEEDS_VARIABLE, os.pathsep.join([str(dynamic), str(engine)]))
        result = CliRunner().invoke(app, ["serve", str(run)])
        assert result.exit_code == 0, result.output
        assert chosen[-1] == expected
    result = CliRunner().invoke(app, ["serve", str(run), "--continuous", "0"])
    assert result.exit_code == 0 and chosen[-1] == 0
