"""benchmarks/ is a package run as `python -m benchmarks.NAME` from the repository root
(issue 28, part 4): no `sys.path` edits, and a results file records that command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


# ----- no benchmark writes into src/; the release step does --------------------------


def _files_under(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path): (path.stat().st_mtime_ns, path.stat().st_size)
        for path in folder.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_report_write_changes_nothing_under_src(monkeypatch, tmp_path):
    from benchmarks import report

    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    monkeypatch.setattr(report, "README", readme)
    monkeypatch.setattr(report, "DOCS", tmp_path / "docs")
    monkeypatch.setattr(sys, "argv", ["report", "--write"])
    before = _files_under(ROOT / "src")
    report.main()
    assert _files_under(ROOT / "src") == before
    assert readme.read_text() == (ROOT / "README.md").read_text()  # README was up to date
    for page in (ROOT / "docs").rglob("*.md"):  # and so was every docs page
        assert (tmp_path / page.relative_to(ROOT)).read_text() == page.read_text(), page


def test_the_release_step_writes_the_reference_from_the_results(monkeypatch, tmp_path, capsys):
    from test_quickstart_reference import run_results, write

    from benchmarks import release, report

    results, packaged = tmp_path / "results", tmp_path / "quickstart-reference.json"
    results.mkdir()
    for seed, bleu in ((0, 20.5), (1, 24.25)):
        write(results, f"quickstart-seed{seed}-15min", run_results(seed, bleu, 40.0))
    monkeypatch.setattr(report, "RESULTS", results)
    monkeypatch.setattr(release, "REFERENCE", packaged)

    with pytest.raises(SystemExit) as stale:
        release.main(["--check"])
    assert str(stale.value) == (
        f"{packaged} differs from benchmarks/results/quickstart-*.json: "
        "run `python -m benchmarks.release`"
    )
    assert not packaged.exists()  # --check writes nothing

    release.main([])
    written = json.loads(packaged.read_text(encoding="utf-8"))
    assert written["note"].startswith("written by `python -m benchmarks.release`")
    (reference,) = written["references"]
    assert reference["seeds"] == [0, 1] and reference["bleu"] == [20.5, 24.25]
    assert reference["files"] == [
        "benchmarks/results/quickstart-seed0-15min.json",
        "benchmarks/results/quickstart-seed1-15min.json",
    ]
    release.main(["--check"])
    assert capsys.readouterr().out.splitlines()[-1] == f"{packaged}: matches benchmarks/results/"


def test_the_release_step_on_a_broken_results_file_says_so_and_writes_nothing(
    monkeypatch, tmp_path
):
    from benchmarks import release, report

    (tmp_path / "quickstart-seed0-15min.json").write_text("{", encoding="utf-8")
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(release, "REFERENCE", tmp_path / "reference.json")
    with pytest.raises(SystemExit) as error:
        release.main([])
    assert str(error.value).startswith(f"release: cannot render from {tmp_path}: JSONDecodeError")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "reference.json").exists()
