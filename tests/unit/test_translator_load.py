"""Loading a run does the work once (issue 28, part 4): the weights resolved, their config
read and its shape checked one time each, by `Translator.load`, by `aiayn translate` and by
the other shapes' `load_shape`; the model loaded is the one the file holds."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import aiayn.apps.model_use
import aiayn.io.checkpoint
from aiayn.apps.model_use import ENCODER_DECODER, load_shape
from aiayn.apps.translate import Translator
from aiayn.cli import app
from aiayn.io.checkpoint import load_model, read_config, resolve_weights
from infer_helpers import make_run

COUNTED = {
    "resolve_weights": aiayn.io.checkpoint.resolve_weights,
    "read_config": aiayn.io.checkpoint.read_config,
    "check_shape": aiayn.apps.model_use.check_shape,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("one-pass"))


@pytest.fixture
def calls(monkeypatch) -> Counter:
    """Calls of each COUNTED function, wherever it was imported to (every module that
    holds it gets a counting wrapper for the test)."""
    counts: Counter = Counter()

    def counting(name, function):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)

        return wrapper

    for name, function in COUNTED.items():
        wrapper = counting(name, function)
        for module in list(sys.modules.values()):
            if getattr(module, name, None) is function:
                monkeypatch.setattr(module, name, wrapper)
    return counts


def test_translator_load_resolves_reads_and_checks_once(run, calls):
    translator = Translator.load(run)
    assert calls == Counter(resolve_weights=1, read_config=1, check_shape=1)
    assert translator.translate(["house."], beam=1)  # a working translator


def test_aiayn_translate_resolves_reads_and_checks_once(run, calls):
    result = CliRunner().invoke(app, ["translate", str(run), "--beam", "1"], input="house.\n")
    assert result.exit_code == 0, result.output
    assert calls == Counter(resolve_weights=1, read_config=1, check_shape=1)


def test_load_shape_resolves_reads_and_checks_once(run, calls):
    model, weights = load_shape(run, ENCODER_DECODER)
    assert model.cfg.architecture == ENCODER_DECODER
    assert calls == Counter(resolve_weights=1, read_config=1, check_shape=1)
    assert weights == run / "checkpoints" / "step-00000001" / "model.safetensors"


def test_the_model_loaded_once_is_the_one_the_file_holds(run):
    weights = resolve_weights(run)
    reference = load_model(weights)  # the config read by load_model itself
    loaded = Translator.load(run).model
    assert loaded.cfg == reference.cfg == read_config(weights)
    expected = reference.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_a_config_given_to_load_model_is_not_read_again(run, calls):
    weights = resolve_weights(run)
    cfg = read_config(weights)
    calls.clear()
    model = load_model(weights, cfg=cfg)
    assert calls["read_config"] == 0 and model.cfg == cfg
