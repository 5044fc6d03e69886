"""torchrun: environment; two gloo processes equal one process with the same global batch,
only rank 0 validates and writes, and a two-process run resumes exactly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import aiayn
from aiayn.training import distributed
from aiayn.training.trainer import train_from_recipe
from train_helpers import RECIPE, make_corpus

# Adam with the paper's eps (1e-9) is almost blind to the scale of the gradient, so a
# lost world_size factor would go unseen; with eps 1 the update follows the gradient's
# size (for gradients well below 1, Adam is close to SGD with momentum).
SCALE_SENSITIVE = ["train.eps=1.0", "train.lr_scale=20"]

# Run under torchrun: train_from_recipe with each rank's log lines in its own file.
PER_RANK_LOGS = """
import logging, os, sys
from aiayn.training.trainer import train_from_recipe
recipe, run_dir, *overrides = sys.argv[1:]
logging.basicConfig(filename=f"{run_dir}.rank{os.environ['RANK']}.log", level=logging.INFO,
                    format="%(message)s")
train_from_recipe(recipe, run_dir, overrides, device="cpu", progress=False)
"""


def test_environment_defaults_to_one_process(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    env = distributed.from_environment()
    assert (env.rank, env.world_size, env.is_main) == (0, 1, True)
    assert distributed.all_reduce([1.0, 2.0], torch.device("cpu")) == [1.0, 2.0]
    assert distributed.all_gather_object("x") == ["x"]
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK=3 WORLD_SIZE=2"):
        distributed.from_environment()


def _torchrun(*args: str) -> None:
    """Run `args` (a module or script and its arguments) in two gloo processes."""
    src = str(Path(aiayn.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        *args,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def _train_two_processes(run_dir: Path, overrides: list[str]) -> None:
    """`aiayn train` on the tiny recipe under torchrun, two processes."""
    _torchrun(
        "-m", "aiayn.cli", "train", str(RECIPE), *overrides, "--run-dir", str(run_dir),
        "--device", "cpu", "--no-progress",
    )  # fmt: skip


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / f"checkpoints/step-{step:08d}/model.safetensors")


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process_and_only_rank_0_validates(tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    common = [
        f"data.corpus={corpus}", "model.dropout=0", "train.max_steps=4", *SCALE_SENSITIVE,
        "train.valid_every_steps=2", "train.valid_bleu_sentences=2",
        "train.log_every_steps=2",
    ]  # fmt: skip
    script = tmp_path / "train_per_rank_logs.py"
    script.write_text(PER_RANK_LOGS)
    _torchrun(str(script), str(RECIPE), str(tmp_path / "two"), *common)
    one = train_from_recipe(
        RECIPE, tmp_path / "one", [*common, "train.accumulation=2"], device="cpu", progress=False
    )
    assert one.steps == 4

    # Same global batch, gradients averaged by DDP and scaled back by world_size: the
    # same weights as one process accumulating both halves (measured: 6e-8 apart; a
    # lost world_size factor: 2e-2).
    a, b = _weights(tmp_path / "one", 4), _weights(tmp_path / "two", 4)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-5)

    # Validation (at updates 2 and 4) runs on rank 0 alone; only rank 0 writes metrics.
    rank0 = (tmp_path / "two.rank0.log").read_text()
    rank1 = (tmp_path / "two.rank1.log").read_text()
    assert [line.split(":")[0] for line in rank0.splitlines() if line.startswith("valid")] == [
        "valid at update 2",
        "valid at update 4",
    ]
    assert "valid at update" not in rank1
    assert "rank 1 of 2 joined" in rank1  # rank 1's log lines do reach its file
    assert [(r["kind"], r["step"]) for r in _records(tmp_path / "two")] == [
        ("train", 2), ("valid", 2), ("train", 4), ("valid", 4),
    ]  # fmt: skip


@pytest.mark.slow
def test_two_process_run_resumed_from_a_checkpoint_equals_the_uninterrupted_run(tmp_path):
    """A two-process run killed after its update-2 checkpoint, resumed to update 4,
    ends bit-identical to the run that was never stopped (dropout on, so every rank's
    RNG state must come back)."""
    corpus = make_corpus(tmp_path / "corpus")
    common = [
        f"data.corpus={corpus}", "model.dropout=0.1", "train.max_steps=4", *SCALE_SENSITIVE,
        "train.checkpoint_every_steps=2", "train.valid_every_steps=2",
    ]  # fmt: skip
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _train_two_processes(whole, common)

    # The run as a crash after update 2 would leave it: its files and the update-2 checkpoint.
    (resumed / "checkpoints").mkdir(parents=True)
    for name in ("config.yaml", "spm.model"):
        shutil.copyfile(whole / name, resumed / name)
    shutil.copytree(whole / "checkpoints/step-00000002", resumed / "checkpoints/step-00000002")
    _train_two_processes(resumed, common)

    assert [r["step"] for r in _records(resumed)] == [4, 4]  # it went on from update 2
    a, b = _weights(whole, 4), _weights(resumed, 4)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
