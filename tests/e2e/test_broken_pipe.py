"""A reader that stops early (`| head`) ends aiayn quietly, with status 1 (click's rule)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

AIAYN = Path(sys.executable).with_name("aiayn")


@pytest.mark.parametrize("args", [["lens", "--help"], ["--help"], ["demo", "--vocab-size", "100"]])
def test_a_closed_pipe_ends_the_command_without_a_message(args):
    command = f"set -o pipefail; {AIAYN} {' '.join(args)} | head -c 1 > /dev/null"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert "Error" not in done.stderr and "error" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert done.returncode in (0, 1)  # 1: click ends so; 0 when the output fit the pipe in time
