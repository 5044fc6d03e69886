"""The fair decoding race (benchmarks/decode_race.py, issue 44 item 5): one system's process
at a time, thread counts chosen by an untimed calibration before the timed calls, no
OpenMP wait policy forced, a shortlist compared only with CTranslate2 given its candidates.
Fake workers stand in for the processes: their "seconds" are set by hand."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import bench_decode, decode_race

# seconds of one call: (system, threads) -> seconds; "ct2" is fastest at 1 thread
SECONDS = {("aiayn", 1): 2.0, ("aiayn", 2): 1.0, ("ct2", 1): 0.5, ("ct2", 2): 0.8}


class Recorder:
    """Starts fake workers and logs every start, call and close, in order."""

    def __init__(self, seconds=None) -> None:
        self.log: list[tuple] = []
        self.alive: set[int] = set()
        self.most_alive = 0
        self.seconds = seconds or (lambda system, threads, cell, call: SECONDS[system, threads])

    def start(self, system: str, threads: int):
        recorder, number = self, len(self.log)
        recorder.alive.add(number)
        recorder.most_alive = max(recorder.most_alive, len(recorder.alive))
        recorder.log.append(("start", system, threads))
        calls = [0]

        class Fake:
            def ask(self, **request):
                if request.get("memory"):
                    return {"memory_mb": {"peak": 100.0 * threads}}
                cell = (request["beam"], request["batch"])
                calls[0] += 1
                recorder.log.append(("call", system, threads, cell))
                seconds = recorder.seconds(system, threads, cell, calls[0])
                return {"seconds": seconds, "tokens": [[system, threads]]}

            def close(self):
                recorder.alive.discard(number)
                recorder.log.append(("close", system, threads))

        return Fake()


def request(cell):
    return {"beam": cell[0], "batch": cell[1]}


def race(recorder, rounds=2, passes=2):
    return decode_race.run_race(
        recorder.start, ["aiayn", "ct2"], [1, 2], [(1, 32), (4, 1)], request, rounds, passes, 2
    )


def test_only_one_systems_process_is_alive_at_a_time():
    recorder = Recorder()
    race(recorder)
    assert recorder.most_alive == 1
    starts = [entry for entry in recorder.log if entry[0] == "start"]
    # calibration: each system at each count; then 2 passes, the second in reverse order
    assert [s[1:] for s in starts] == [
        ("aiayn", 1), ("aiayn", 2), ("ct2", 1), ("ct2", 2),
        ("aiayn", 1), ("aiayn", 2), ("ct2", 1), ("ct2", 2),
        ("ct2", 1), ("ct2", 2), ("aiayn", 1), ("aiayn", 2),
    ]  # fmt: skip


def test_each_systems_threads_are_chosen_before_the_timed_calls_and_kept():
    """aiayn at 2 threads is slow in the calibration (the first 4 processes) and fast in
    the timed race. The choice follows the calibration, not the timed run, and "at its
    best" takes the timed calls at the chosen count."""

    def seconds(system, threads, cell, call):
        calibrating = sum(entry[0] == "close" for entry in recorder.log) < 4
        if (system, threads) == ("aiayn", 2):
            return 5.0 if calibrating else 0.1
        return SECONDS[system, threads]

    recorder = Recorder(seconds)
    found = race(recorder)
    assert found.best_threads["aiayn", (1, 32)] == 1  # 2.0 s against 5.0 s calibrated
    assert found.best_threads["ct2", (1, 32)] == 1  # 0.5 against 0.8
    assert found.at_best("aiayn", (1, 32)) == [2.0] * 4  # 2 passes x 2 rounds
    assert found.times["aiayn", 2, (1, 32)] == [0.1] * 4  # timed, but not chosen


def test_the_fewer_threads_win_a_tie():
    calibration = {("a", 2, (1, 1)): 1.0, ("a", 1, (1, 1)): 1.0, ("a", 4, (1, 1)): 0.9}
    assert decode_race.choose_threads(calibration) == {("a", (1, 1)): 4}
    del calibration["a", 4, (1, 1)]
    assert decode_race.choose_threads(calibration) == {("a", (1, 1)): 1}


def test_calls_of_a_pass_and_round_line_up_across_systems_and_load_is_recorded():
    found = race(Recorder(), rounds=3, passes=2)
    for system in ("aiayn", "ct2"):
        for threads in (1, 2):
            assert len(found.times[system, threads, (4, 1)]) == 6
    assert found.outputs["ct2", (1, 32)] == [["ct2", 1]]  # the first process's tokens
    assert found.memory["aiayn", 2] == {"loaded": 200.0, "peak": 200.0}
    assert len(found.load) == 8  # one record per timed process
    assert {"load_before", "load_after", "pass_number"} <= set(found.load[0])


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="rounds"):
        race(Recorder(), rounds=0)
    with pytest.raises(ValueError, match="needs systems"):
        decode_race.run_race(Recorder().start, [], [1], [(1, 1)], request, 1)


def test_no_wait_policy_is_forced_on_a_worker(monkeypatch):
    started = []

    class Worker:
        def __init__(self, module, system, args, threads, *more, **options):
            started.append((system, threads, options.get("env")))
            self.threads = threads

        def ask(self, **request):
            if request.get("memory"):
                return {}
            return {"seconds": 1.0, "tokens": [[1]]}

        def close(self):
            pass

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(bench_decode.common, "Worker", Worker)
    args = argparse.Namespace(
        device="cpu", int8_shortlist_output="fp32", src_len=5, tgt_len=5,
        rounds=1, passes=1, calibration_calls=1,
    )  # fmt: skip
    bench_decode.measure(args, ["aiayn", "ct2-int8"], [1, 2], "small", [(1, 1)], None, None, None)
    assert {env for *_, env in started} == {None}  # the parent's environment, nothing added
    assert decode_race.stated_settings() == {}


def test_a_shortlist_is_compared_only_with_ct2_given_its_candidates():
    cell = (1, 32)
    found = decode_race.Race()
    for system, seconds in (("aiayn-shortlist", 1.0), ("ct2-int8", 2.0), ("ct2-fp32", 4.0)):
        found.times[system, 1, cell] = [seconds, seconds]
        found.outputs[system, cell] = [[5, 6]]
    found.best_threads = {(s, cell): 1 for s in ("aiayn-shortlist", "ct2-int8", "ct2-fp32")}
    args = argparse.Namespace(tgt_len=2)
    systems = ["aiayn-shortlist", "ct2-int8", "ct2-fp32"]
    summary, records = bench_decode.summarise_cell(
        args, found, systems, "small", cell, None, ["aiayn-shortlist"], None
    )
    (listed,) = [r for r in records if r["system"] == "aiayn-shortlist"]
    assert listed["speedup_vs_ct2_int8"] is None and listed["speedup_vs_ct2_fp32"] is None
    assert summary["best_vs_ct2_int8"] is None  # no CTranslate2 with the vmap ran
    assert summary["threads"] == "best" and summary["threads_chosen"]["ct2-int8"] == 1
    found.times["ct2-int8-vmap", 1, cell] = [1.5, 1.5]
    found.best_threads["ct2-int8-vmap", cell] = 1
    found.outputs["ct2-int8-vmap", cell] = [[5, 6]]
    summary, records = bench_decode.summarise_cell(
        args, found, [*systems, "ct2-int8-vmap"], "small", cell, 1, ["aiayn-shortlist"], None
    )
    (listed,) = [r for r in records if r["system"] == "aiayn-shortlist"]
    assert listed["speedup_vs_ct2_int8_vmap"] == pytest.approx(1.5)
    assert summary["best_vs_ct2_int8"] == pytest.approx(1.5)
    assert summary["tokens_per_s"]["aiayn-shortlist"] == pytest.approx(64.0)  # 32 x 2 / 1 s


def test_the_report_reads_each_at_its_best_from_the_calibrated_rows(monkeypatch, tmp_path):
    """A race's cells at threads 1 and 2 and "best": the every-cell goals read the thread
    counts; "each at its better thread count" reads the calibrated rows as they are,
    not the faster of the timed counts; the cells table shows the chosen counts."""
    import json

    from benchmarks import report
    from benchmarks.report import speed, verdicts

    def cell(threads, best, fp32, chosen=None):
        record = dict(
            threads=threads, size="small", search="greedy", batch=32, best_system="aiayn",
            best_vs_ct2_int8=best, fp32_vs_ct2_fp32=fp32, shortlist_size=None,
            tokens_per_s={"aiayn": 1000.0 * best, "ct2-int8": 1000.0},
        )  # fmt: skip
        return record if chosen is None else {**record, "threads_chosen": chosen}

    data = {
        "date": "2026-11-27 15:00",
        "best_of": ["aiayn"],
        "best_rule": "preference",
        "results": [],
        "cells": [
            cell(1, 0.8, 0.9),
            cell(2, 1.4, 1.2),  # the faster timed count, which calibration did not choose
            cell("best", 0.8, 0.9, {"aiayn": 1, "ct2-int8": 1}),
        ],
    }
    (tmp_path / "decode-fair.json").write_text(json.dumps(data))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    goals = {g.name: g for g in verdicts.decode_goals()}
    assert goals["decode-cells-int8"].values == (0.8, 1.4)
    assert goals["decode-cells-int8-better-threads"].values == (0.8,)
    assert goals["decode-cells-fp32-better-threads"].values == (0.9,)
    text = speed.decode_cells("decode-fair")
    assert "| best | small | greedy | 32 | 1,000 (1) | 800 (1) |" in text
    assert 'Threads "best": each system at the thread count' in text
