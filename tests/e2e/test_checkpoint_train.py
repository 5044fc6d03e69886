"""Training checkpoints: atomic under a kill, keep-last, averaging."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import aiayn
from aiayn import ModelConfig, Transformer
from aiayn.io.checkpoint import (
    average_checkpoints,
    average_last,
    latest_checkpoint,
    load_model,
    load_trainer_state,
    save_checkpoint,
    step_checkpoints,
)

CFG = ModelConfig.tiny(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=1)


def test_kill_while_writing_leaves_the_previous_checkpoint_loadable(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal, torch
        from aiayn import ModelConfig, Transformer
        from aiayn.io import checkpoint
        model = Transformer(ModelConfig.tiny(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=1))
        checkpoint.save_checkpoint({str(tmp_path)!r}, 1, model, {{"step": 1}})
        def dying_save(obj, file):  # save_checkpoint hands torch.save an open file
            file.write(b"half a trainer state")
            file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        checkpoint.torch.save = dying_save
        checkpoint.save_checkpoint({str(tmp_path)!r}, 2, model, {{"step": 2}})
        """
    )
    src = str(Path(aiayn.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
    assert done.returncode == -9, done.stderr.decode()
    assert latest_checkpoint(tmp_path).name == "step-00000001"
    assert [d.name for d in step_checkpoints(tmp_path)] == ["step-00000001"]
    assert load_trainer_state(latest_checkpoint(tmp_path)) == {"step": 1}
    load_model(latest_checkpoint(tmp_path) / "model.safetensors")


def test_keep_last_deletes_older_step_checkpoints(tmp_path):
    model = Transformer(CFG)
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, model, {"step": step}, keep_last=2)
    assert [d.name for d in step_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]
    save_checkpoint(tmp_path, 4, model, {"step": 44}, keep_last=2)  # the same step again replaces
    assert load_trainer_state(tmp_path / "checkpoints/step-00000004") == {"step": 44}


def test_averaging_two_checkpoints_is_the_elementwise_mean(tmp_path):
    torch.manual_seed(1)
    first = Transformer(CFG)
    torch.manual_seed(2)
    second = Transformer(CFG)
    save_checkpoint(tmp_path, 1, first, {})
    save_checkpoint(tmp_path, 2, second, {})
    paths = [d / "model.safetensors" for d in step_checkpoints(tmp_path)]
    averaged = average_checkpoints(paths)
    a, b = load_file(paths[0]), load_file(paths[1])
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (a[name] + b[name]) / 2, rtol=0, atol=1e-7)
    path = average_last(tmp_path, 2)
    assert path == tmp_path / "checkpoints/average-last-2/model.safetensors"
    model = load_model(path)
    mean = dict(model.state_dict())
    expected = first.state_dict()
    for name in mean:
        torch.testing.assert_close(
            mean[name], (expected[name] + second.state_dict()[name]) / 2, rtol=0, atol=1e-7
        )
    with pytest.raises(ValueError, match="fewer than the 3"):
        average_last(tmp_path, 3)
