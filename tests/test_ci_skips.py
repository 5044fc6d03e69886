"""Under CI=true a skip for want of the SWORD modules is a failure (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")

# What the quickstart and the Bible data tests do when the modules are absent.
SKIPPING = """
import pytest

needs_sword = pytest.mark.skipif(True, reason="Debian SWORD modules absent: apt-get install sword-text-web")


@needs_sword
def test_marked():
    pass


def test_skipped_inside():
    pytest.skip("no SWORD modules under /empty")


@pytest.mark.skipif(True, reason="PyTorch built without oneDNN")
def test_other_reason():
    pass
"""


def _run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    shutil.copyfile(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_needs_sword.py").write_text(SKIPPING)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        "-rA",
    ]
    return subprocess.run(
        [*command, str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_outside_ci_a_missing_sword_install_skips(tmp_path):
    done = _run(tmp_path, None)
    assert done.returncode == 0, done.stdout
    assert "3 skipped" in done.stdout


def test_under_ci_a_missing_sword_install_fails_with_the_reason(tmp_path):
    done = _run(tmp_path, "true")
    assert done.returncode == 1, done.stdout
    # a skipif marker skips at setup, so its failure reads as an error
    assert "1 failed, 1 skipped, 1 error" in done.stdout, done.stdout
    assert "ERROR test_needs_sword.py::test_marked" in done.stdout
    assert "FAILED test_needs_sword.py::test_skipped_inside" in done.stdout
    assert "SKIPPED [1] test_needs_sword.py:16: PyTorch built without oneDNN" in done.stdout
    assert "a test that needs the SWORD modules was skipped" in done.stdout
    assert "apt-get install sword-text-web" in done.stdout
