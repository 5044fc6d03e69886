"""The decoding benchmark's own arithmetic: per-cell ratios, memory, the synthetic corpus,
and the report's tables of its 8 cells and of memory (from a hand-made results file)."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import bench_decode
from benchmarks import common as bench_common
from benchmarks import report as bench_report
from benchmarks.report import cpu_inference, pages, speed, verdicts


@pytest.fixture(scope="module")
def bench():
    return bench_decode


@pytest.fixture(scope="module")
def common():
    return bench_common


@pytest.fixture()
def report():
    return bench_report  # tests replace its `load` with monkeypatch; its pages read it there


TIMES = {
    "aiayn": [2.0, 4.0, 3.0],
    "aiayn-int8": [1.0, 2.0, 1.5],
    "aiayn-int8-shortlist": [1.2, 2.2, 1.6],
    "ct2-int8": [1.5, 2.0, 3.0],
    "ct2-fp32": [2.0, 2.0, 2.0],
}


def test_the_best_is_fixed_in_advance_not_the_fastest_of_the_run(bench):
    summary = bench.cell_summary(TIMES, ["aiayn-int8", "aiayn-int8-shortlist", "aiayn"])
    assert summary["best_system"] == "aiayn-int8"  # the first that ran
    # per round, CT2 int8's time over aiayn int8's: 1.5, 1.0, 2.0
    assert summary["best_vs_ct2_int8"] == pytest.approx(1.5)
    slower_first = bench.cell_summary(TIMES, ["aiayn", "aiayn-int8"])
    assert slower_first["best_system"] == "aiayn"  # slower, but named first
    # per round, CT2 fp32's time over aiayn fp32's: 1.0, 0.5, 0.667
    assert summary["fp32_vs_ct2_fp32"] == pytest.approx(statistics.median([1.0, 0.5, 2 / 3]))


def test_a_system_outside_best_of_is_never_best(bench):
    summary = bench.cell_summary(TIMES, ["aiayn"])
    assert summary["best_system"] == "aiayn"
    assert summary["best_vs_ct2_int8"] == pytest.approx(statistics.median([0.75, 0.5, 1.0]))


def test_a_shortlist_is_compared_only_with_ct2_given_the_same_candidates(bench):
    summary = bench.cell_summary(TIMES, ["aiayn-int8-shortlist"])
    assert summary["best_system"] == "aiayn-int8-shortlist"
    assert summary["best_vs_ct2_int8"] is None  # no CTranslate2 with the vocabulary map ran
    with_vmap = {**TIMES, "ct2-int8-vmap": [0.6, 1.1, 0.8]}
    summary = bench.cell_summary(with_vmap, ["aiayn-int8-shortlist"])
    assert summary["best_vs_ct2_int8"] == pytest.approx(statistics.median([0.5, 0.5, 0.5]))


def test_the_vmap_holds_the_shortlists_candidates_in_ct2s_format(bench, tmp_path):
    import torch

    from aiayn.inference.shortlist import Shortlist

    vocab = bench.common.VOCAB
    table = torch.full((vocab, 2), -1)
    table[5] = torch.tensor([7, 9])
    Shortlist(torch.tensor([3, 4]), table, eos_id=0).save(tmp_path / "s.safetensors")
    bench.write_vmap(tmp_path / "s.safetensors", tmp_path / "vmap.txt")
    assert (tmp_path / "vmap.txt").read_text() == "\tw3 w4\nw5\tw7 w9\n"


def test_ratios_are_none_where_a_system_did_not_run(bench):
    times = {s: TIMES[s] for s in ("aiayn-int8", "ct2-fp32")}
    summary = bench.cell_summary(times, ["aiayn-shortlist"])
    assert summary == {"best_system": None, "best_vs_ct2_int8": None, "fp32_vs_ct2_fp32": None}


def test_outputs_are_compared_with_the_same_aiayn_without_the_change(bench):
    assert bench.same_as("aiayn") is None
    assert bench.same_as("aiayn-int8") == "aiayn"
    assert bench.same_as("aiayn-shortlist") == "aiayn"
    assert bench.same_as("aiayn-int8-shortlist") == "aiayn-int8"
    assert bench.same_as("hf-bf16") == "aiayn-bf16"
    assert bench.same_as("ct2-int8") == "aiayn"


def test_unknown_systems_and_bad_thread_counts_are_refused(bench, monkeypatch, capsys):
    for argv, said in (
        (["--systems", "aiayn,nonesuch"], "unknown system(s) nonesuch"),
        (["--best-of", "aiayn-int9"], "unknown system(s) aiayn-int9"),
        (["--threads", "2,x"], "--threads '2,x'"),
        (["--threads", "0"], "thread counts are 1 or more"),
    ):
        monkeypatch.setattr("sys.argv", ["bench_decode.py", *argv])
        with pytest.raises(SystemExit):
            bench.main()
        assert said in capsys.readouterr().err


def test_a_run_records_what_it_measures_for_the_report(bench, report, monkeypatch):
    monkeypatch.setattr(bench_common, "machine", lambda: "Test CPU, 2 cores")
    args = SimpleNamespace(
        sizes="small,base", beams="1,4", batch=32, no_latency=False, device="cpu"
    )
    records = report.measures(
        {"measures": bench.decode_measures(args, ["aiayn", "ct2-int8"], [2, 1])}
    )
    assert records[0] == {
        "system": "aiayn, CTranslate2 int8: decoding",
        "cell": "random Marian small and base, greedy and beam 4, batch 32 and 1, 1 and 2 "
        "threads, Test CPU, 2 cores",
        "harness": "bench_decode's race: one system's process at a time, each system's "
        "threads per cell chosen by an untimed calibration, no OpenMP wait policy forced",
    }
    assert records[1]["system"] == "each decoding worker's resident memory"
    args.sizes, args.beams, args.no_latency = "small", "4", True
    decoding = bench.decode_measures(args, ["aiayn"], [1])[0]
    assert decoding["cell"] == "random Marian small, beam 4, batch 32, 1 thread, Test CPU, 2 cores"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_memory_high_water_mark_rises_with_an_allocation(common):
    before = common.memory_mb()
    # above this process's earlier peak too (a test worker may have peaked before)
    size_mb = 64 + max(0, int(before["peak"] - before["now"]))
    block = bytearray(size_mb * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])  # touch every page: resident
    after = common.memory_mb()
    assert after["peak"] - before["peak"] >= 60
    assert after["now"] - before["now"] >= 60
    del block
    freed = common.memory_mb()
    assert after["now"] - freed["now"] >= 60
    assert freed["peak"] >= after["peak"] - 1  # the high-water mark stays (kernel counters lag)


def test_synthetic_corpus_translates_each_source_id_by_few_ids(common):
    sources, targets = common.synthetic_parallel(pairs=300, translations=3, function_share=0.0)
    assert len(sources) == len(targets) == 300
    assert {len(line) for line in sources + targets} == {29}
    seen = {i for line in sources + targets for i in line}
    assert min(seen) >= 2 and max(seen) <= common.VOCAB - 2  # no eos, unk or pad
    aligned = defaultdict(set)
    for src, tgt in zip(sources, targets, strict=True):
        for s, t in zip(src, tgt, strict=True):
            aligned[s].add(t)
    assert max(len(ts) for ts in aligned.values()) == 3
    again = common.synthetic_parallel(pairs=300, translations=3, function_share=0.0)
    assert again == (sources, targets)


def test_function_words_follow_zipf_and_take_their_share(common):
    sources, targets = common.synthetic_parallel(pairs=400, function_share=0.5, seed=3)
    top_target = Counter(t for line in targets for t in line).most_common(1)[0][1]
    top_source = Counter(s for line in sources for s in line).most_common(1)[0][1]
    tokens = 400 * 29
    harmonic = sum(1 / rank for rank in range(1, common.VOCAB - 2))  # Zipf over 7,996 ids
    # the first function word takes 1/harmonic of the function words: 0.5 / 9.56 = 5.2%
    assert top_target / tokens == pytest.approx(0.5 / harmonic, abs=0.01)
    assert top_source / tokens < 0.005  # sources are uniform


CELL = dict(size="small", search="greedy", batch=32, shortlist_size=1234)
DATA = {
    "date": "2026-11-25 01:00",
    "machine": "test cpu",
    "cpu_flags": ["avx2", "avx512f"],
    "versions": {"torch": "2.13"},
    "commit": "abc1234",
    "command": "bench_decode.py --threads 2,1",
    "args": {"threads": "2,1"},
    "best_of": ["aiayn-int8", "aiayn"],
    "shortlist": {"frequent": 1000, "per_source": 20},
    "results": [
        dict(threads=2, **CELL, system="aiayn-shortlist", speedup_vs_ct2_int8=1.5),
        dict(threads=2, **CELL, system="aiayn", speedup_vs_ct2_int8=0.78),
    ],
    "cells": [
        dict(
            threads=2,
            **CELL,
            best_system="aiayn-int8",
            best_vs_ct2_int8=1.25,
            fp32_vs_ct2_fp32=1.04,
            tokens_per_s={"ct2-int8": 7800.0, "aiayn": 6100.0, "aiayn-int8": 9750.0},
        ),
        dict(
            threads=1,
            **CELL,
            best_system="aiayn",
            best_vs_ct2_int8=0.9,
            fp32_vs_ct2_fp32=0.95,
            tokens_per_s={"ct2-int8": 5000.0, "aiayn": 4500.0, "aiayn-int8": 4400.0},
        ),
    ],
    "memory": [
        dict(threads=2, size="base", system="aiayn-int8", rss_loaded_mb=412.4, rss_peak_mb=530.6),
        dict(threads=1, size="base", system="aiayn-int8", rss_loaded_mb=999.0, rss_peak_mb=999.0),
        dict(threads=2, size="base", system="ct2-int8", rss_loaded_mb=88.0, rss_peak_mb=None),
    ],
}


def test_the_cells_table_shows_each_thread_count_and_its_ratios(report, monkeypatch):
    monkeypatch.setattr(report, "load", lambda name: DATA)
    lines = speed.decode_cells().splitlines()
    header = lines[0]
    assert "| CT2 int8 | aiayn fp32 | aiayn int8, int8 output | best aiayn |" in header
    assert "| aiayn fp32 + shortlist |" not in header  # no tok/s column without its figures
    rows = [line for line in lines if line.startswith("| 2 |") or line.startswith("| 1 |")]
    assert rows[0] == (
        "| 2 | small | greedy | 32 | 7,800 | 6,100 | 9,750 | aiayn int8, int8 output "
        "| **1.25x** | 1.50x | 1.04x | 1,234 |"
    )
    assert rows[1].startswith("| 1 | small | greedy | 32 | 5,000 | 4,500 | 4,400 | aiayn fp32 |")
    assert "the fastest of aiayn int8, int8 output, aiayn fp32 (the run's" in " ".join(lines)
    assert "frequent 1000, 20 per source piece" in speed.decode_cells()


def test_the_memory_table_shows_the_first_thread_count(report, monkeypatch):
    monkeypatch.setattr(report, "load", lambda name: DATA)
    text = speed.decode_memory()
    assert "| base | aiayn int8 | 412 | 531 |" in text
    assert "| base | CTranslate2 int8 | 88 |  |" in text
    assert "999" not in text  # the 1-thread run's figures


def write(folder: Path, name: str, data: dict) -> None:
    (folder / f"{name}.json").write_text(json.dumps(data))


@pytest.fixture()
def results(monkeypatch, tmp_path):
    """An empty results folder the report reads (no goal has its files yet)."""
    monkeypatch.setattr(bench_report, "RESULTS", tmp_path)
    return tmp_path


def test_every_cell_goals_read_the_fair_race_at_both_thread_counts(results):
    """The every-cell rows come from decode-fair.json: all its cells, 1 and 2 threads
    alike, against 1.0x; "each at its better thread count" divides aiayn's best tok/s
    over both counts by CTranslate2's best (9,750 / 7,800), with no goal of its own."""
    write(results, "decode-fair", {**DATA, "results": [], "best_rule": "preference"})
    goals = {g.name: g for g in verdicts.decode_goals()}
    cells = goals["decode-cells-int8"]
    assert cells.values == (1.25, 0.9) and cells.goal == 1.0 and cells.met is False
    assert goals["decode-cells-fp32"].values == (1.04, 0.95)
    better = goals["decode-cells-int8-better-threads"]
    assert better.values == (pytest.approx(9750 / 7800),) and better.met is None
    assert "decode-hf-bf16" not in goals  # decode.json, the older harness, is absent


def test_batch_32_goals_read_the_fair_race_and_bf16_the_older_file(results):
    row = dict(size="small", search="greedy", batch=32)
    fair = {
        **DATA,
        "cells": [],
        "results": [
            dict(row, threads=1, system="aiayn", speedup_vs_hf=1.45, speedup_vs_ct2_fp32=0.85),
            dict(row, threads=2, system="aiayn", speedup_vs_hf=2.1, speedup_vs_ct2_fp32=1.3),
            dict(row, threads=2, system="aiayn", batch=1, speedup_vs_hf=9.0),  # not batch 32
        ],
    }
    fair["results"][2]["speedup_vs_ct2_fp32"] = None
    old_row = dict(row, threads=2, system="aiayn", speedup_vs_hf=2.39, speedup_vs_ct2_fp32=1.1)
    write(results, "decode-fair", fair)
    write(results, "decode", {**DATA, "cells": [], "results": [old_row]})
    goals = {g.name: g for g in verdicts.decode_goals()}
    assert goals["decode-hf-fp32"].values == (1.45, 2.1)  # not decode.json's 2.39
    assert goals["decode-hf-fp32"].met is False
    assert goals["decode-hf-fp32"].files == ("decode-fair",)
    assert goals["decode-ct2-fp32"].values == (0.85, 1.3)


def test_serving_goals_are_met_by_either_server_and_a_file_by_every_setting(results):
    def served(at_16, at_64, p99_at_16=700.0):
        cells = [dict(clients=16, server="one at a time", speedup=1.0, p99_ms=2000.0)]
        cells += [dict(clients=16, server="batching", speedup=at_16, p99_ms=p99_at_16)]
        at_64 = dict(clients=64, server="batching", speedup=at_64, p99_ms=3000.0)
        return {"cells": [*cells, at_64]}

    write(results, "serve-continuous-groups", served(4.0, 6.0))
    write(results, "serve-dynamic", served(5.5, 7.9))
    systems = [dict(system="batches", speedup_vs_batches=1.0)]
    systems += [dict(system="continuous-8", speedup_vs_batches=0.38)]
    systems += [dict(system="continuous-32", speedup_vs_batches=2.5)]
    write(results, "translate", {"cells": systems})
    goals = {g.name: g for g in verdicts.engine_goals()}
    assert goals["serve-16"].values == (4.0, 5.5) and goals["serve-16"].met is True  # 5.5 >= 5
    assert goals["serve-64"].values == (6.0, 7.9) and goals["serve-64"].met is False  # < 8
    assert goals["translate-file"].values == (0.38, 2.5) and goals["translate-file"].met is False
    # 5.5x with a p99 of 1.2 s is not the goal at 16 clients (p99 under 1 s as well)
    write(results, "serve-dynamic", served(5.5, 7.9, p99_at_16=1200.0))
    goals = {g.name: g for g in verdicts.engine_goals()}
    assert goals["serve-16"].values == (4.0, 0.0) and goals["serve-16"].met is False


def test_the_serving_limit_divides_64_clients_by_the_best_offline_decoder(results):
    cells = [dict(clients=64, server="batching", speedup=3.0, p99_ms=900.0, sentences_per_s=45.0)]
    cells += [dict(clients=64, server="one at a time", speedup=1.0, sentences_per_s=15.0)]
    offline = [dict(clients=0, server="offline, sorted batches", sentences_per_s=50.0)]
    offline += [dict(clients=0, server="offline, continuous 32", sentences_per_s=40.0)]
    write(results, "serve-dynamic", {"cells": cells + offline})
    write(results, "serve-continuous-groups", {"cells": cells})  # no offline: no value
    goals = {g.name: g for g in verdicts.engine_goals()}
    assert goals["serve-limit"].values == (0.9,) and goals["serve-limit"].met is True
    assert goals["serve-64"].values == (3.0, 3.0)  # the offline cells are no server's


def test_the_default_path_goals_divide_per_round_by_the_best_plain_path_and_the_commit_before(
    results,
):
    def cell(system, times, threads=2, speedup=None):
        return dict(system=system, threads=threads, times_s=times, speedup_vs_batches=speedup,
                    sentences_per_s=296 / sorted(times)[1])  # fmt: skip

    cells = [cell("batches", [10.0, 12.0, 11.0]), cell("continuous-32", [9.0] * 3, speedup=1.2)]
    cells += [cell("batches:int8", [1.0, 1.0, 1.0])]  # another dtype: neither plain nor engine
    cells += [cell("batches@4900a20", [15.0, 16.0, 14.0]), cell("default", [6.0, 8.0, 7.0])]
    cells += [cell("batches", [5.0, 5.0, 5.0], threads=1)]  # no default at 1 thread: no goal
    write(results, "translate", {"cells": cells})
    goals = {g.name: g for g in verdicts.engine_goals()}
    # the best plain path is the engine (9 s): 9/6, 9/8, 9/7 -> median 9/7
    assert goals["translate-default-2"].values == pytest.approx((9 / 7,))
    assert goals["translate-default-2"].met is True
    # against the commit before: 15/6, 16/8, 14/7 -> median 2.5/2.0/2.0 -> 2.0
    assert goals["translate-vs-before-2"].values == pytest.approx((2.0,))
    assert "4900a20's batches" in goals["translate-vs-before-2"].compared
    assert not any(name.endswith("-1") for name in goals if name.startswith("translate-"))
    # issue 29's goal still reads the float32 engines only
    assert goals["translate-file"].values == (1.2,)


def test_the_batch_1_overhead_goal_divides_ct2s_whole_step_by_aiayns_time_outside_gemm(results):
    overhead = {
        "results": [
            dict(system="cache", slots=1, ms_per_step=1.8, outside_gemm_ms=0.75),
            dict(system="ct2-fp32", slots=1, ms_per_step=0.6),
            dict(system="ct2-int8", slots=1, ms_per_step=0.3),
            dict(system="cache", slots=32, ms_per_step=7.0, outside_gemm_ms=1.3),
        ]
    }
    write(results, "step-overhead", overhead)
    goals = {g.name: g for g in verdicts.engine_goals()}
    assert goals["step-fp32"].values == (pytest.approx(0.8),)  # 0.6 / 0.75
    assert goals["step-int8"].values == (pytest.approx(0.4),) and goals["step-int8"].met is False


def test_the_generation_goal_reads_each_cell_from_its_newest_file(results):
    """generate-engine.json re-measured GPT-2 small at batch 1 and 2 threads: its 1.62x
    replaces generate.json's 1.39x there; the 1-thread cell stays generate-1thread's."""

    def run(date, threads, value, field="speedup_vs_hf_fp32"):
        record = {"size": "gpt2-small", "batch": 1, "system": "aiayn", field: value}
        peer = {"size": "gpt2-small", "batch": 1, "system": "hf", field: 1.0}
        return {"date": date, "args": {"threads": threads}, "results": [record, peer]}

    write(results, "generate", run("2026-11-24 09:03", "2", 1.39))
    write(results, "generate-1thread", run("2026-11-24 09:07", "1", 1.51))
    write(results, "generate-engine", run("2026-11-25 23:44", "2", 1.62, "speedup_vs_hf"))
    (goal,) = verdicts.generate_goals()
    assert sorted(goal.values) == [1.51, 1.62] and goal.met is True
    write(results, "generate-1thread", run("2026-11-24 09:07", "1", 1.34))
    (goal,) = verdicts.generate_goals()
    assert sorted(goal.values) == [1.34, 1.62] and goal.met is False


@pytest.mark.parametrize(
    ("rule", "values", "goal", "met"),
    [
        ("every", (1.1, 0.9), 1.0, False),  # the lowest decides
        ("every", (1.1, 1.0), 1.0, True),
        ("best", (0.5, 1.2), 1.0, True),  # the highest decides
        ("median", (24.45, 25.39, 25.79), 25.0, True),  # 25.39
        ("median", (24.45, 24.9, 25.79), 25.0, False),
    ],
)
def test_a_goals_verdict_follows_its_rule(rule, values, goal, met):
    found = verdicts.Goal("g", "work", "ratio", "fp32", values, goal, ("f",), rule=rule)
    assert found.met is met
    assert verdicts.Goal("g", "w", "r", "p", values, None, ("f",)).met is None  # no goal


def test_new_tables_are_rendered_only_once_their_results_exist(report, monkeypatch):
    monkeypatch.setattr(pages, "WHEN", {name: lambda: False for name in pages.WHEN})
    rendered = pages.render_all()
    assert not set(pages.WHEN) & set(rendered)
    assert "decode" in rendered  # the tables without a condition still are


QUALITY = {
    "date": "2026-11-25 08:00",
    "sentences": 200,
    "bleu_signature": "nrefs:1|case:mixed",
    "int8_min_elements": 65536,
    "shortlist": {
        "frequent": 1000,
        "per_source": 20,
        "recall": 0.9512,
        "mean_candidates": 1234.4,
        "vocab_size": 8000,
    },
    "results": [
        dict(setting="fp32", bleu=24.0, chrf=45.5, greedy_same_as_fp32=200, seconds=3.0),
        dict(setting="int8", bleu=23.75, chrf=45.25, greedy_same_as_fp32=183, seconds=2.0),
        dict(setting="fp32-shortlist", bleu=24.1, chrf=45.0, greedy_same_as_fp32=199, seconds=2.5),
    ],
}


def test_the_quality_table_gives_each_setting_against_fp32(report, monkeypatch):
    monkeypatch.setattr(report, "load", lambda name: QUALITY)
    text = cpu_inference.quality()
    assert (
        "| int8 as `--dtype int8` runs this model: the FFN | 23.75 | -0.25 | 45.25 | 183/200 (91.5%) |"
        in text
    )
    assert "| fp32 + shortlist | 24.10 | +0.10 | 45.00 | 199/200 (99.5%) |" in text
    assert "| fp32 | 24.00 | +0.00 | 45.50 | 200/200 (100.0%) |" in text
    assert "1,234 candidates per sentence" in text and "recall 95.1%" in text


def test_the_memory_table_gives_what_the_frozen_model_holds(report, monkeypatch):
    data = {
        "date": "2026-11-25 08:00",
        "results": [
            dict(size="base", code="before", commit="ead7eb6", dtype="fp32", held_mb=540.0,
                 with_model_mb=700.0, weights_mb=180.0),
            dict(size="base", code="now", commit="abc1234", dtype="int8", held_mb=90.0,
                 with_model_mb=300.0, weights_mb=180.0),
        ],
    }  # fmt: skip
    monkeypatch.setattr(report, "load", lambda name: data)
    text = cpu_inference.memory()
    assert "| base | before (`ead7eb6`) | fp32 | 180 | 700 | 540 (3.00x) |" in text
    assert "| base | now (`abc1234`) | int8 | 180 | 300 | 90 (0.50x) |" in text


def test_the_int8_kernel_table_marks_the_fastest_candidate(report, monkeypatch):
    def record(system, us, vs):
        return dict(shape="base ffn1", out=2048, inp=512, rows=4, system=system, us=us, vs_fp32=vs)

    data = {
        "date": "2026-11-25 08:00",
        "results": [
            record("fp32", 40.0, 1.0),
            record("int8 fbgemm", 25.0, 1.61),
            record("torch._int_mm", 50.0, 0.8),
        ],
    }
    monkeypatch.setattr(report, "load", lambda name: data)
    text = cpu_inference.int8_kernels()
    assert "| weight (out x in) | rows | fp32 us | int8 fbgemm | torch._int_mm |" in text
    assert "| base ffn1 | 4 | 40.0 | **1.61x** | 0.80x |" in text
    assert "base ffn1 2048 x 512" in text
