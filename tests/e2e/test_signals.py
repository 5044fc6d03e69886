"""Ctrl-C on a real `aiayn train`: the first SIGINT saves a checkpoint and stops (exit 130),
a second one stops at once without saving."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.io.checkpoint import latest_checkpoint, load_model, load_trainer_state, step_checkpoints
from train_helpers import RECIPE, make_corpus

# No step or timed checkpoints of its own: a checkpoint after the signal is the signal's.
NO_CHECKPOINTS = [
    "train.max_steps=100000", "train.checkpoint_every_steps=null", "train.valid_every_steps=null",
    "train.valid_bleu_sentences=0", "train.log_every_steps=1",
]  # fmt: skip


def _start_training(run_dir: Path, corpus: Path, overrides: list[str]) -> subprocess.Popen:
    src = str(Path(aiayn.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [
        sys.executable, "-m", "aiayn.cli", "train", str(RECIPE), f"data.corpus={corpus}",
        *NO_CHECKPOINTS, *overrides, "--run", str(run_dir), "--device", "cpu", "--no-progress",
    ]  # fmt: skip
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for_updates(process: subprocess.Popen, run_dir: Path, updates: int) -> None:
    """Until metrics.jsonl shows `updates` training updates (at most 120 s)."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        lines = metrics.read_text().splitlines() if metrics.is_file() else []
        if sum(json.loads(line)["kind"] == "train" for line in lines) >= updates:
            return
        time.sleep(0.05)
    process.kill()
    pytest.fail("training did not start within 120 s")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("corpus") / "en-de")


@pytest.mark.slow
def test_sigint_saves_a_loadable_checkpoint_then_exits_130(corpus, tmp_path):
    process = _start_training(tmp_path, corpus, [])
    _wait_for_updates(process, tmp_path, 2)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)

    assert process.returncode == 130, stdout + stderr
    assert "SIGINT received: saving a checkpoint, then stopping" in stderr
    assert "stopped (signal) at update" in stdout
    checkpoint = latest_checkpoint(tmp_path)
    assert checkpoint is not None and step_checkpoints(tmp_path) == [checkpoint]
    state = load_trainer_state(checkpoint)
    assert state["state"]["step"] >= 2 and checkpoint.name == f"step-{state['state']['step']:08d}"
    model = load_model(checkpoint / "model.safetensors")
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.slow
def test_a_second_sigint_stops_at_once_without_saving(corpus, tmp_path):
    # Updates of a few hundred ms, so the second Ctrl-C lands while the first one's
    # update is still running, before the loop could save.
    bigger = ["model.d_model=256", "model.d_ff=2048", "model.n_layers=2", "train.max_tokens=1024"]
    process = _start_training(tmp_path, corpus, bigger)
    _wait_for_updates(process, tmp_path, 1)
    process.send_signal(signal.SIGINT)
    while "SIGINT received" not in process.stderr.readline():  # the first was handled
        assert process.poll() is None
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)

    assert process.returncode == 130, stdout + stderr
    assert "stopped (signal)" not in stdout
    assert step_checkpoints(tmp_path) == []
