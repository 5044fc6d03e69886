"""Under CI=true every skip is a failure unless tests/conftest.py's CI_ALLOWED_SKIPS
names it: a skipif mark, pytest.skip, a skipping fixture, importorskip (in a test or a
whole module), xfail and xpass. Checked on small generated test files, run by a pytest
of their own with and without CI=true."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

# One test for each way a test can pass without running, and one allowlisted skip.
SKIPPING = """
import pytest

needs_sword = pytest.mark.skipif(True, reason="Debian SWORD modules absent: apt-get install sword-text-web")


@pytest.fixture
def chromium():
    pytest.skip("needs headless Chromium: apt-get install chromium")


@needs_sword
def test_marked():
    pass


def test_skipped_inside():
    pytest.skip("cannot mount a tmpfs here (needs root)")


def test_skipping_fixture(chromium):
    pass


def test_import_skipped():
    pytest.importorskip("a_module_that_is_not_installed")


@pytest.mark.xfail(reason="known to fail")
def test_xfailed():
    assert False


@pytest.mark.xfail(reason="expected to fail, passes")
def test_xpassed():
    pass


def test_allowed():
    pytest.skip("a CUDA device exists here")


def test_runs():
    pass
"""

# A whole module skipped while collected, as test_marian.py and test_hf_models.py do.
MODULE_SKIPPED = """
import pytest

transformers = pytest.importorskip("a_module_that_is_not_installed")


def test_never_collected():
    pass
"""


def _run(tmp_path: Path, ci: str | None, **files: str) -> subprocess.CompletedProcess:
    """pytest, with the real conftest.py, on the test files given by name and source."""
    shutil.copyfile(CONFTEST, tmp_path / "conftest.py")
    for name, source in files.items():
        (tmp_path / f"{name}.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*command, "-rA", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("ci", [None, "false", "1"])
def test_outside_ci_skips_skip(tmp_path, ci):
    done = _run(tmp_path, ci, test_generated=SKIPPING)
    assert done.returncode == 0, done.stdout
    assert "1 passed, 5 skipped, 1 xfailed, 1 xpassed" in done.stdout, done.stdout


def test_under_ci_every_skip_fails_with_its_reason_but_the_allowlisted(tmp_path):
    done = _run(tmp_path, "true", test_generated=SKIPPING)
    out = done.stdout
    assert done.returncode == 1, out
    # a skipif mark or a skipping fixture skips at setup, so its failure reads as an error
    assert "4 failed, 1 passed, 1 skipped, 2 errors" in out, out
    lines = out.splitlines()
    for kind, test, reason in (
        ("ERROR", "test_marked", "apt-get install sword-text-web"),
        ("ERROR", "test_skipping_fixture", "apt-get install chromium"),
        ("FAILED", "test_skipped_inside", "cannot mount a tmpfs here (needs root)"),
        ("FAILED", "test_import_skipped", "No module named 'a_module_that_is_not_installed'"),
        ("FAILED", "test_xfailed", "(xfail: known to fail)"),
        ("FAILED", "test_xpassed", "(xfail: expected to fail, passes)"),
    ):
        start = f"{kind} test_generated.py::{test} - CI=true: a skip is a failure ("
        assert any(line.startswith(start) and reason in line for line in lines), (test, out)
    assert "SKIPPED [1] test_generated.py:40: a CUDA device exists here" in out, out


def test_a_module_skipped_at_collection_skips_outside_ci_and_fails_under_it(tmp_path):
    files = {"test_generated": MODULE_SKIPPED, "test_other": "def test_runs():\n    pass\n"}
    outside = _run(tmp_path, None, **files)
    assert outside.returncode == 0, outside.stdout
    assert "1 passed, 1 skipped" in outside.stdout, outside.stdout
    under = _run(tmp_path, "true", **files)
    # a collection error stops the session before any test runs (pytest's exit code 2)
    assert under.returncode == 2, under.stdout
    assert "ERROR test_generated.py - CI=true: a skip is a failure" in under.stdout, under.stdout
    assert "No module named 'a_module_that_is_not_installed'" in under.stdout, under.stdout
    assert "1 error" in under.stdout and "passed" not in under.stdout, under.stdout


def test_every_allowed_skip_says_why():
    # tests/conftest.py by its path: `import conftest` may find tests/unit/data/conftest.py
    spec = importlib.util.spec_from_file_location("tests_conftest", CONFTEST)
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    assert conftest.CI_ALLOWED_SKIPS, "an empty allowlist: drop this test instead"
    for phrase, why in conftest.CI_ALLOWED_SKIPS.items():
        assert phrase.strip() and why.strip(), phrase


def _make_browser(tmp_path: Path, uid: int, ci: str | None) -> subprocess.CompletedProcess:
    """`make browser` where neither chromium nor chromedriver is on PATH and apt-get fails;
    `id -u` says `uid`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, script in (("id", f"echo {uid}"), ("apt-get", "echo 'E: no network' >&2; exit 100")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    if ci is not None:
        env["CI"] = ci
    makefile = CONFTEST.parents[1] / "Makefile"
    command = [shutil.which("make") or "make", "-s", "-f", str(makefile), "browser"]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)


@pytest.mark.skipif(
    shutil.which("make") is None, reason="needs make (installed with build-essential)"
)
@pytest.mark.parametrize("uid", [0, 1000])
def test_make_browser_stops_under_ci_when_chromium_cannot_be_installed(tmp_path, uid):
    outside = _make_browser(tmp_path, uid, None)
    assert outside.returncode == 0, outside.stderr
    assert "chromium chromium-driver" in outside.stdout
    under = _make_browser(tmp_path, uid, "true")
    assert under.returncode != 0, under.stdout
    assert "error: CI=true needs the browser test" in under.stderr, under.stderr
    assert "chromium chromium-driver" in under.stderr
