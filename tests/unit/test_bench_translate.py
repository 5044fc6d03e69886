"""bench_translate's systems: the `aiayn translate` options and environment of each."""

import os
from pathlib import Path

import pytest

from benchmarks import report as bench_report
from benchmarks.bench_translate import environment, options
from benchmarks.report import engine


def test_each_system_names_its_translate_options():
    assert options("batches") == []
    assert options("default") == []
    assert options("batches:int8") == []
    assert options("batches@4900a20") == []
    assert options("continuous-8") == ["--continuous", "8"]
    assert options("continuous-32:bfloat16") == ["--continuous", "32"]
    assert options("continuous-compiled-32") == ["--continuous", "32", "--compile"]


@pytest.mark.parametrize(
    "system, message",
    [
        ("default:int8", "takes no dtype"),
        ("batches:float16", "unknown dtype 'float16'"),
        ("continuous-x", "unknown system"),
        ("beams", "unknown system"),
    ],
)
def test_an_unknown_system_is_refused_before_anything_runs(system, message):
    with pytest.raises(ValueError, match=message):
        options(system)


def test_the_environment_fixes_the_dtype_except_for_the_default(monkeypatch):
    monkeypatch.setenv("AIAYN_DTYPE", "bfloat16")  # the caller's own is never inherited
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert environment("batches", 2, {})["AIAYN_DTYPE"] == "float32"
    assert environment("continuous-32:int8", 1, {})["AIAYN_DTYPE"] == "int8"
    default = environment("default", 2, {})
    assert "AIAYN_DTYPE" not in default and default["OMP_NUM_THREADS"] == "2"
    assert "OMP_WAIT_POLICY" not in default  # no wait policy forced on any system


def test_a_baseline_runs_from_its_own_checkout(tmp_path: Path):
    env = environment("batches@abc1234", 2, {"abc1234": tmp_path})
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "src")
    assert env["AIAYN_DTYPE"] == "float32"


def test_the_table_shows_start_up_and_decoding_alone_where_the_run_timed_them(monkeypatch):
    cell = dict(threads=2, system="batches", sentences=296, seconds=7.0, sentences_per_s=42.3,
                speedup_vs_batches=1.0, bleu=25.4, same_as_batches=296)  # fmt: skip
    timed = dict(cell, system="default", start_s=2.0, decoding_sentences_per_s=59.0)
    data = dict(date="2026-12-03 12:00", machine="test cpu", cpu_flags=["avx2"],
                versions={"torch": "2.13"}, commit="abc1234", command="bench",
                beam=8, alpha=1.0, rounds=3, cells=[cell, timed])  # fmt: skip
    monkeypatch.setattr(bench_report, "load", lambda name: data)
    text = engine.translate_file()
    assert "| start s | decoding alone, sentences/s |" in text
    assert "| 2 | `default` | 42.3 | 7.00 | 1.00x | 25.40 | 296/296 | 2.00 | 59.0 |" in text
    assert "| 2 | `batches` | 42.3 | 7.00 | 1.00x | 25.40 | 296/296 |  |  |" in text  # older
