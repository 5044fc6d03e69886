"""bench_translate's systems: the `aiayn translate` options and environment of each."""

import os
from pathlib import Path

import pytest

from benchmarks.bench_translate import environment, options


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
