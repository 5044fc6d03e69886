"""A damaged checkpoint is refused in one line that names its file, by every command
that reads one: model-config metadata that is no JSON object, sizes its weights do
not have (checked before any memory is allocated), and a stray checkpoints/step-abc.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, safe_open, save_file
from typer.testing import CliRunner

from aiayn import ModelConfig, Transformer
from aiayn.cli import app
from aiayn.io import checkpoint
from aiayn.io.checkpoint import (
    CONFIG_KEY,
    config_size_bound,
    load_model,
    read_config,
    resolve_weights,
    save_model,
    step_checkpoints,
)
from aiayn.models import build_model
from aiayn.models.registry import SHAPES
from aiayn.nn.kernels import KERNELS
from aiayn.nn.positions.base import POSITIONS
from infer_helpers import shape_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return shape_runs(tmp_path_factory.mktemp("runs"))


def damaged(run: Path, root: Path, config: str) -> tuple[Path, Path]:
    """A copy of `run` whose weights carry `config` as their model-config metadata."""
    copy = root / f"damaged-{run.name}"
    shutil.copytree(run, copy)
    weights = resolve_weights(copy)
    with safe_open(str(weights), framework="pt") as f:
        metadata = dict(f.metadata())
    save_file(load_file(str(weights)), str(weights), metadata={**metadata, CONFIG_KEY: config})
    return copy, weights


def commands(runs: dict[str, Path], tmp_path: Path) -> dict[str, tuple[str, list[str], str]]:
    """command -> (the run it reads, its arguments after the run, its stdin)."""
    return {
        "translate": ("mt", [], "das haus.\n"),
        "export": ("mt", [str(tmp_path / "export")], ""),
        "patch": ("gpt", ["--clean", "das haus.", "--corrupt", "ein haus.", "--right", "das",
                          "--wrong", "ein", "--out", str(tmp_path / "patch")], ""),
        "lens": ("gpt", ["das haus.", "--out", str(tmp_path / "lens")], ""),
        "serve": ("mt", ["--port", "1"], ""),  # refused before it listens
    }  # fmt: skip


def one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("aiayn: error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("config", "found"),
    [("null", "NoneType null"), ("1", "int 1"), ("[[1, 2], [3]]", "list [[1, 2], [3]]")],
)
def test_model_config_metadata_that_is_no_json_object_is_refused_by_every_reader(
    runs, tmp_path, config, found
):
    for command, (shape, args, stdin) in commands(runs, tmp_path).items():
        run, weights = damaged(runs[shape], tmp_path / "runs" / command, config)
        result = CliRunner().invoke(app, [command, str(run), *args], input=stdin)
        one_line_error(result, str(weights), found, "not a JSON object")
    assert not (tmp_path / "export").exists() and not (tmp_path / "patch").exists()


def test_model_config_metadata_with_a_field_of_the_wrong_type_names_the_file(runs, tmp_path):
    values = read_config(resolve_weights(runs["mt"])).to_dict() | {"d_model": [32]}
    _, weights = damaged(runs["mt"], tmp_path, json.dumps(values))
    with pytest.raises(ValueError, match=rf"{weights}: .*d_model"):
        read_config(weights)


@pytest.mark.parametrize("field", ["vocab_size", "d_ff"])
def test_absurd_sizes_are_refused_before_any_memory_is_allocated(runs, tmp_path, field):
    values = read_config(resolve_weights(runs["mt"])).to_dict() | {field: 10**11}
    run, weights = damaged(runs["mt"], tmp_path, json.dumps(values))
    result = CliRunner().invoke(app, ["translate", str(run)], input="das haus.\n")
    one_line_error(result, str(weights), f"{field}={10**11}", "does not belong to these weights")
    # the refusal comes from the tensors' shapes alone, the model built on no memory
    with pytest.raises(ValueError, match="stores it as"):
        load_model(weights)


def test_a_stray_step_directory_is_ignored_with_a_warning(runs, tmp_path, caplog):
    run = tmp_path / "run"
    shutil.copytree(runs["mt"], run)
    good = run / "checkpoints" / "step-00000001"
    shutil.copytree(good, run / "checkpoints" / "step-abc")
    with caplog.at_level("WARNING", logger="aiayn.io.checkpoint"):
        assert step_checkpoints(run) == [good]
    assert "step-abc is not a step checkpoint" in caplog.text
    assert resolve_weights(run) == good / "model.safetensors"
    translated = CliRunner().invoke(app, ["translate", str(run)], input="das haus.\n")
    assert translated.exit_code == 0, translated.output
    averaged = CliRunner().invoke(app, ["average", str(run), "--last", "1"])
    assert averaged.exit_code == 0, averaged.output
    refused = CliRunner().invoke(app, ["average", str(run), "--last", "2"])
    one_line_error(refused, "1 step checkpoint(s), fewer than the 2")


def test_a_model_not_built_on_the_meta_device_is_held_to_a_lower_bound(tmp_path):
    # Performer draws its directions from a seed as it is made: no meta-device build
    cfg = ModelConfig.tiny(48, d_model=32, d_ff=64, attention="performer")
    weights = save_model(Transformer(cfg), tmp_path / "model.safetensors")
    assert load_model(weights).cfg == cfg
    values = cfg.to_dict() | {"vocab_size": 10**11}
    with safe_open(str(weights), framework="pt") as f:
        metadata = dict(f.metadata())
    save_file(load_file(str(weights)), str(weights), {**metadata, CONFIG_KEY: json.dumps(values)})
    with pytest.raises(ValueError, match=rf"{weights}: .*vocab_size={10**11}.* needs at least"):
        load_model(weights)


def numbers_held(model) -> int:
    """Every number a model holds: its parameters and all its buffers, stored or not."""
    return sum(t.numel() for t in [*model.parameters(), *model.buffers()])


@pytest.mark.parametrize("architecture", SHAPES.names())
@pytest.mark.parametrize("attention", KERNELS.names())
def test_the_size_bound_exceeds_every_shape_and_kernels_real_count(architecture, attention):
    built = 0
    for positional in POSITIONS.names():
        for extra in ({}, {"n_kv_heads": 2, "d_k": 24, "activation": "swish"}):
            cfg = ModelConfig.tiny(
                300, architecture=architecture, attention=attention, positional=positional,
                d_ff=48, max_len=40, output_bias=True, tie_embeddings=False, tie_output=False,
                **extra,
            )  # fmt: skip
            try:
                model = build_model(cfg)
            except ValueError:  # a combination the shape or kernel refuses (alibi's bias)
                continue
            assert numbers_held(model) <= config_size_bound(cfg), (positional, extra)
            built += 1
    assert built >= 4 or attention != "sdpa"  # sdpa takes every shape and position scheme


def test_a_sound_file_is_built_once_and_never_on_the_meta_device(runs, monkeypatch):
    devices = []

    def spy(cfg):
        devices.append(torch.get_default_device().type)
        return build_model(cfg)

    monkeypatch.setattr(checkpoint, "build_model", spy)
    weights = resolve_weights(runs["mt"])
    assert load_model(weights).cfg == read_config(weights)
    assert devices == ["cpu"]
    values = read_config(weights).to_dict() | {"vocab_size": 10**11}
    _, bad = damaged(runs["mt"], runs["mt"].parent / "spied", json.dumps(values))
    with pytest.raises(ValueError, match="stores it as"):
        load_model(bad)
    assert devices == ["cpu", "meta"]  # refused from the shapes alone


def test_a_config_within_the_files_size_but_of_other_shapes_is_refused_by_name(runs, tmp_path):
    values = read_config(resolve_weights(runs["mt"])).to_dict()
    values["d_ff"] = values["d_ff"] // 2
    _, weights = damaged(runs["mt"], tmp_path, json.dumps(values))
    with pytest.raises(ValueError, match=rf"{weights}: .*linear.*of shape .*stores it as"):
        load_model(weights)
