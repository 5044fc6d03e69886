"""Recipes: the task key, and resuming runs whose config.yaml predates a key."""

from __future__ import annotations

import pytest
import yaml

from aiayn.training.recipe import CONFIG_FILE, check_same_run, recipe_from_dict

VALUES = {"data": {"corpus": "/c"}, "model": {"preset": "tiny"}, "train": {"max_steps": 1}}


def test_the_task_defaults_to_translation_and_must_be_registered():
    recipe = recipe_from_dict(VALUES)
    assert recipe.task == "translation" and recipe.to_dict()["data"]["task"] == "translation"
    assert recipe_from_dict(VALUES, ["data.task=translation"]).task == "translation"
    assert recipe_from_dict(VALUES, ["data.task=lm"]).task == "lm"
    known = "classify, lm, lm_translation, mlm, translation"
    with pytest.raises(ValueError, match=rf"data\.task must be one of {known}, got 'gan'"):
        recipe_from_dict(VALUES, ["data.task=gan"])


@pytest.mark.parametrize(
    ("model", "task"),
    [
        ({"preset": "gpt"}, "lm"),
        ({"preset": "bert"}, "mlm"),
        ({"preset": "tiny", "architecture": "decoder_only"}, "lm"),
        ({"preset": "tiny"}, "translation"),
    ],
)
def test_without_a_task_the_recipe_takes_its_model_shapes(model, task):
    """The default task is the shape spec's (`ShapeSpec.task`), read from the preset's
    architecture when the model section names none."""
    values = {**VALUES, "data": {"corpus": VALUES["data"]["corpus"]}, "model": model}
    assert recipe_from_dict(values).task == task


def test_a_run_without_the_task_key_resumes_as_translation(tmp_path):
    old = {"data": {"corpus": "/c"}, "model": {"d_model": 32}, "train": {"max_steps": 1}}
    (tmp_path / CONFIG_FILE).write_text(yaml.safe_dump(old))
    new = {**old, "data": {"corpus": "/c", "task": "translation"}}
    check_same_run(tmp_path, {**new, "train": {"max_steps": 5}})  # limits may change
    with pytest.raises(ValueError, match=r"data\.task differ"):
        check_same_run(tmp_path, {**new, "data": {"corpus": "/c", "task": "lm"}})
    with pytest.raises(ValueError, match=r"model\.d_model differ"):
        check_same_run(tmp_path, {**new, "model": {"d_model": 64}})


def test_a_run_written_before_newer_model_fields_resumes(tmp_path):
    from aiayn.config import ModelConfig

    resolved = ModelConfig.tiny(vocab_size=40).to_dict()
    old_fields = {k: v for k, v in resolved.items() if k not in ("attention", "kept_heads")}
    old = {"data": {"corpus": "/c"}, "model": old_fields, "train": {"max_steps": 1}}
    (tmp_path / CONFIG_FILE).write_text(yaml.safe_dump(old))
    new = {"data": {"corpus": "/c", "task": "translation"}, "model": resolved}
    check_same_run(tmp_path, {**new, "train": {"max_steps": 5}})  # the defaults match
    changed = {**resolved, "attention": "explicit"}
    with pytest.raises(ValueError, match=r"model\.attention differ"):
        check_same_run(tmp_path, {**new, "model": changed, "train": {"max_steps": 5}})


def test_train_help_names_every_packaged_recipe():
    from typer.testing import CliRunner

    from aiayn.cli import app
    from aiayn.config.recipes import recipe_names, recipes_dir

    names = recipe_names()
    assert names == sorted(p.name.removesuffix(".yaml") for p in recipes_dir().iterdir()
                           if p.suffix == ".yaml")  # fmt: skip
    assert {"bible-en-es-cpu", "gpt-bible-en-cpu", "prefix-lm-translate-bible-en-es-cpu"} <= set(
        names
    )
    shown = " ".join(
        CliRunner().invoke(app, ["train", "--help"], terminal_width=400).output.split()
    )
    for name in names:
        assert name in shown


def test_an_exponent_without_a_dot_is_a_number_in_a_recipe_and_an_override(tmp_path):
    """PyYAML's YAML 1.1 rules read `1e-6` as a string; a recipe reads it as YAML 1.2 does."""
    from aiayn.training.recipe import load_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "data:\n  corpus: data\ntrain:\n  max_steps: 1\n  eps: 1e-6\n  lr_scale: 2E+0\n"
    )
    loaded = load_recipe(recipe)
    assert loaded.train.eps == pytest.approx(1e-6) and isinstance(loaded.train.eps, float)
    assert loaded.train.lr_scale == 2.0
    loaded = load_recipe(recipe, ["train.eps=+3e-7", "train.seed=7"])
    assert loaded.train.eps == pytest.approx(3e-7)
    assert loaded.train.seed == 7 and isinstance(loaded.train.seed, int)
    with pytest.raises(ValueError, match="eps"):  # a quoted number stays a string, refused
        load_recipe(recipe, ["train.eps='1e-6'"])
