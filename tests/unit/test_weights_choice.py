"""The one rule that picks the weights to translate with, and the run's own subword model."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from aiayn import ModelConfig, Transformer
from aiayn.apps.translate import Translator
from aiayn.cli import app
from aiayn.data.tokenizer import SentencePieceTokenizer
from aiayn.io.checkpoint import (
    AVERAGED_FILE,
    average_last,
    averaged_steps,
    resolve_weights,
    save_best,
    save_checkpoint,
)
from train_helpers import make_corpus


@pytest.fixture(scope="module")
def spm(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("corpus") / "en-de") / "spm.model"


def marked_model(spm: Path, marker: float) -> Transformer:
    """A tiny model for `spm` whose every weight is `marker`: which file was loaded shows."""
    tokenizer = SentencePieceTokenizer.load(spm)
    cfg = ModelConfig.tiny(
        vocab_size=tokenizer.vocab_size,
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_layers=1,
    )
    model = Transformer(cfg)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(marker)
    return model


def loaded_marker(run: Path) -> float:
    return next(Translator.load(run).model.parameters()).flatten()[0].item()


def test_the_preference_order_average_when_current_then_best_then_latest(spm, tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(spm, run / "spm.model")
    for step in (1, 2):
        save_checkpoint(run, step, marked_model(spm, step), {"step": step})
    assert resolve_weights(run) == run / "checkpoints/step-00000002/model.safetensors"
    assert loaded_marker(run) == 2.0  # latest

    save_best(run, marked_model(spm, 10.0), {"step": 1, "loss": 1.0})
    assert loaded_marker(run) == 10.0  # best before latest

    result = CliRunner().invoke(app, ["average", str(run), "--last", "2"])
    assert result.exit_code == 0, result.output
    assert "(the average of steps 1, 2)" in result.output
    record = json.loads((run / "checkpoints/average-last-2" / AVERAGED_FILE).read_text())
    assert record["steps"] == [1, 2] == averaged_steps(run / "checkpoints/average-last-2")
    assert loaded_marker(run) == 1.5  # a current average before best

    save_checkpoint(run, 3, marked_model(spm, 3.0), {"step": 3})  # training went on
    with caplog.at_level(logging.WARNING, logger="aiayn.io.checkpoint"):
        assert loaded_marker(run) == 10.0  # the stale average is passed over...
    assert "average-last-2 is older than the newest checkpoint (step 3)" in caplog.text
    assert f"re-average with: aiayn average {run} --last 2" in caplog.text  # ...aloud

    shutil.rmtree(run / "checkpoints/best")
    assert loaded_marker(run) == 3.0  # then the newest step

    average_last(run, 2)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aiayn.io.checkpoint"):
        assert loaded_marker(run) == 2.5  # re-averaged: current again, no warning
    assert caplog.text == ""
    average_last(run, 3)
    older = run / "checkpoints/average-last-2/model.safetensors"
    os.utime(older, (older.stat().st_atime, older.stat().st_mtime - 60))  # no same-tick tie
    assert loaded_marker(run) == 2.0  # of two current averages, the one written last


def test_an_average_without_its_record_counts_as_stale(spm, tmp_path):
    run = tmp_path / "run"
    for step in (1, 2):
        save_checkpoint(run, step, marked_model(spm, step), {"step": step})
    average_last(run, 2)
    (run / "checkpoints/average-last-2" / AVERAGED_FILE).unlink()  # made by an older aiayn
    assert averaged_steps(run / "checkpoints/average-last-2") is None
    assert resolve_weights(run) == run / "checkpoints/step-00000002/model.safetensors"


def test_the_subword_model_is_the_run_s_own_never_a_parent_folder_s(spm, tmp_path):
    shutil.copyfile(spm, tmp_path / "spm.model")  # a parent folder's, of another run
    run = tmp_path / "runs" / "a"
    save_checkpoint(run, 1, marked_model(spm, 1.0), {"step": 1})
    with pytest.raises(FileNotFoundError, match=r"no subword model \(spm\.model\)"):
        Translator.load(run)
    weights = run / "checkpoints/step-00000001/model.safetensors"
    with pytest.raises(FileNotFoundError):
        Translator.load(weights)

    shutil.copyfile(spm, run / "spm.model")  # RUN/spm.model, where the layout puts it
    assert Translator.load(run).tokenizer.path == run / "spm.model"
    assert Translator.load(weights).tokenizer.path == run / "spm.model"

    bare = tmp_path / "bare"  # weights with their subword model beside them (a pruned run)
    bare.mkdir()
    shutil.copyfile(weights, bare / "model.safetensors")
    shutil.copyfile(spm, bare / "spm.model")
    assert Translator.load(bare).tokenizer.path == bare / "spm.model"
