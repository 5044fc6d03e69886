"""torchrun: environment, and two gloo processes equal one process with the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import aiayn
from aiayn import distributed
from aiayn.train import train_from_recipe
from train_helpers import RECIPE, make_corpus


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


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process_with_accumulation(tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    common = [
        f"data.corpus={corpus}", "model.dropout=0", "train.max_steps=3",
        "train.valid_bleu_sentences=0", "train.valid_every_steps=null",
    ]  # fmt: skip
    src = str(Path(aiayn.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "aiayn.cli", "train", str(RECIPE), *common, "--run-dir", str(tmp_path / "two"),
        "--device", "cpu", "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    one = train_from_recipe(
        RECIPE, tmp_path / "one", [*common, "train.accumulation=2"], device="cpu", progress=False
    )
    assert one.steps == 3
    a = load_file(tmp_path / "one/checkpoints/step-00000003/model.safetensors")
    b = load_file(tmp_path / "two/checkpoints/step-00000003/model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)
