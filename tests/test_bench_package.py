"""benchmarks/ is a package run as `python -m benchmarks.NAME` from the repository root
(issue 28, part 4): no `sys.path` edits, and a results file records that command."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")


def test_no_benchmark_or_test_edits_sys_path():
    edits = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("benchmarks", "tests")
        for path in sorted((ROOT / folder).glob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "sys.path.insert" in line and path.name != Path(__file__).name
    ]
    assert edits == []


def test_every_benchmark_imports_as_a_module_of_the_package():
    # A fresh interpreter from the repository root, as `python -m benchmarks.NAME` starts:
    # the root on sys.path and nothing else of benchmarks/, and importing leaves it so.
    code = (
        "import importlib, sys\nbefore = list(sys.path)\n"
        "for name in sys.argv[1:]: importlib.import_module(name)\n"
        "assert sys.path == before, set(sys.path) - set(before)"
    )
    names = [f"benchmarks.{name}" for name in MODULES]
    result = subprocess.run(
        [sys.executable, "-c", code, *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(names) >= 15 and "benchmarks.bench_decode" in names


@pytest.mark.parametrize(
    ("spec", "argv", "command"),
    [
        (
            "benchmarks.bench_decode",
            ["/repo/benchmarks/bench_decode.py", "--threads", "2,1"],
            "python -m benchmarks.bench_decode --threads 2,1",
        ),
        ("pkg.__main__", ["/x/pkg/__main__.py", "--quick"], "python -m pkg --quick"),
        (None, ["/x/script.py", "--rounds", "3"], "script.py --rounds 3"),
    ],
)
def test_a_results_file_records_the_command_that_ran(monkeypatch, spec, argv, command):
    from benchmarks import common

    main = types.ModuleType("__main__")
    main.__spec__ = None if spec is None else types.SimpleNamespace(name=spec)
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", argv)
    assert common.provenance()["command"] == command
