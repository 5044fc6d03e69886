"""Plug-ins take their own options: kernels (`attention_options`), position schemes
(`position_options`) and tasks (a recipe's `data.task_options`), checked against the
names each declares, and reaching the plug-in as keyword arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from aiayn.config import ModelConfig
from aiayn.config.plugins import Registry
from aiayn.models import build_model
from aiayn.nn.positions.relative import RelativePositionBias
from aiayn.nn.positions.rotary import RotaryPositions, rotary_angles
from aiayn.training.recipe import CONFIG_FILE, check_same_run, recipe_from_dict
from aiayn.training.tasks import build_task
from aiayn.training.tasks.mlm import Masking, mask_tokens

VALUES = {"data": {"corpus": "/c"}, "model": {"preset": "tiny"}, "train": {"max_steps": 1}}


def only(model: torch.nn.Module, kind: type) -> list:
    return [m for m in model.modules() if isinstance(m, kind)]


# ----- the registry ------------------------------------------------------------------


def test_a_registry_checks_options_against_the_declared_names():
    registry: Registry = Registry("widget", "aiayn.nn.positions", "aiayn.none", "W", "W_options")

    @registry.register("plain")
    def plain(**options):
        return options

    @registry.register("tunable", options=("depth", "width"))
    def tunable(**options):
        return options

    assert tunable.options == ("depth", "width")  # the decorator declares them
    assert registry.options("tunable", {"depth": 2}) == {"depth": 2}
    assert registry.options("tunable", None) == {}
    with pytest.raises(ValueError, match=r"W_options: widget 'tunable' takes no option 'size'; "):
        registry.options("tunable", {"size": 1, "depth": 2})
    with pytest.raises(ValueError, match=r"widget 'plain' takes no option 'x'; it takes: none"):
        registry.options("plain", {"x": 1})


# ----- position schemes ----------------------------------------------------------------


def test_rotary_takes_its_base_as_an_option():
    cfg = ModelConfig.tiny(40, positional="rotary", position_options={"base": 500_000.0})
    assert cfg.position_options == (("base", 500_000.0),)
    schemes = only(build_model(cfg), RotaryPositions)
    assert schemes
    expected = rotary_angles(cfg.max_len, cfg.d_k, 500_000.0)
    for scheme in schemes:
        assert torch.allclose(scheme.cos, torch.cos(expected).float())
    default = only(build_model(ModelConfig.tiny(40, positional="rotary")), RotaryPositions)[0]
    assert not torch.allclose(default.cos, schemes[0].cos)  # the option changed the angles


def test_relative_takes_its_buckets_and_distance_as_options():
    options = {"num_buckets": 16, "max_distance": 64}
    cfg = ModelConfig.tiny(40, positional="relative", position_options=options)
    schemes = only(build_model(cfg), RelativePositionBias)
    assert len(schemes) == 2  # encoder's and decoder's
    for scheme in schemes:
        assert (scheme.num_buckets, scheme.max_distance) == (16, 64)
        assert scheme.bias.weight.shape == (16, cfg.n_heads)


@pytest.mark.parametrize(
    ("positional", "options", "message"),
    [
        ("sinusoidal", {"base": 10.0}, r"position_options: position scheme 'sinusoidal' takes no "
         r"option 'base'; it takes: none"),
        ("rotary", {"theta": 10.0}, r"takes no option 'theta'; it takes: base"),
        ("rotary", {"base": 0.5}, r"rotary base must be a finite number above 1, got 0.5"),
        ("relative", {"num_buckets": 7}, r"even num_buckets"),
        ("relative", {"max_distance": 12.5}, r"relative max_distance must be an integer"),
    ],
)  # fmt: skip
def test_position_options_are_refused_by_name(positional, options, message):
    # names are refused as the config is made, values when the scheme is built
    with pytest.raises(ValueError, match=message):
        build_model(ModelConfig.tiny(40, positional=positional, position_options=options))


def test_position_options_survive_the_config_round_trip_and_a_checkpoint(tmp_path):
    from aiayn.io.checkpoint import load_model, save_model

    cfg = ModelConfig.tiny(40, positional="rotary", position_options={"base": 1000.0})
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    model = build_model(cfg)
    path = save_model(model, tmp_path / "model.safetensors")
    loaded = load_model(path)
    assert loaded.cfg.position_options == (("base", 1000.0),)
    ids = torch.randint(3, 40, (2, 7))
    model.eval(), loaded.eval()
    assert torch.equal(model(ids, ids), loaded(ids, ids))


def test_a_run_written_before_position_options_resumes(tmp_path):
    resolved = ModelConfig.tiny(vocab_size=40).to_dict()
    old_fields = {k: v for k, v in resolved.items() if k != "position_options"}
    old = {"data": {"corpus": "/c", "task": "translation"}, "model": old_fields}
    (tmp_path / CONFIG_FILE).write_text(yaml.safe_dump({**old, "train": {"max_steps": 1}}))
    new = {"data": {"corpus": "/c", "task": "translation", "task_options": {}}, "model": resolved}
    check_same_run(tmp_path, {**new, "train": {"max_steps": 5}})
    changed = {**resolved, "position_options": [["base", 10.0]]}
    with pytest.raises(ValueError, match=r"model\.position_options differ"):
        check_same_run(tmp_path, {**new, "model": changed})
    with pytest.raises(ValueError, match=r"data\.task_options differ"):
        check_same_run(tmp_path, {**new, "data": {**new["data"], "task_options": {"x": 1}}})


# ----- tasks ------------------------------------------------------------------------


def test_mlm_takes_its_masking_rates_from_the_recipe():
    values = {**VALUES, "model": {"preset": "bert"}}
    recipe = recipe_from_dict(
        values, ["data.task_options={select: 0.5, to_mask: 1.0, to_random: 0}"]
    )
    assert recipe.task == "mlm"
    assert recipe.task_options == {"select": 0.5, "to_mask": 1.0, "to_random": 0}
    assert recipe.to_dict()["data"]["task_options"] == recipe.task_options
    cfg = ModelConfig.bert(vocab_size=100)
    task = build_task(recipe.task, cfg, recipe.task_options)
    assert task.rates == recipe.task_options
    # the rates reach the masking: half the eligible positions chosen, all of them [MASK]
    specials, mask, pad = (0, 1, 2, 3), 3, 0
    masking = Masking.for_vocabulary(100, specials, mask, pad, **task.rates)
    ids = np.random.default_rng(0).integers(4, 100, size=(20, 40))
    inputs, labels = mask_tokens(ids, masking, np.random.default_rng(1))
    chosen = labels != pad
    assert (chosen.sum(1) == 20).all()  # round(0.5 * 40)
    assert (inputs[chosen] == mask).all()


@pytest.mark.parametrize(
    ("task", "options", "message"),
    [
        ("mlm", "{select: 1.5}", r"mlm select must be in \[0, 1\], got 1.5"),
        ("mlm", "{to_mask: 0.9, to_random: 0.2}", r"to_mask \+ to_random must be at most 1"),
        ("mlm", "{ratio: 0.1}", r"data\.task_options: training task 'mlm' takes no option "
         r"'ratio'; it takes: select, to_mask, to_random"),
        ("translation", "{beam: 4}", r"training task 'translation' takes no option 'beam'; it "
         r"takes: none"),
        ("translation", "[1, 2]", r"data\.task_options must map option names to values"),
    ],
)  # fmt: skip
def test_task_options_are_refused_by_name(task, options, message):
    overrides = [f"data.task={task}", f"data.task_options={options}"]
    with pytest.raises(ValueError, match=message):
        recipe = recipe_from_dict(VALUES, overrides)
        build_task(recipe.task, ModelConfig.bert(vocab_size=100), recipe.task_options)


def test_kernel_options_are_checked_the_same_way():
    message = r"attention_options: attention kernel 'sdpa' takes no option 'window'; it takes: none"
    with pytest.raises(ValueError, match=message):
        ModelConfig.tiny(40, attention_options={"window": 3})
