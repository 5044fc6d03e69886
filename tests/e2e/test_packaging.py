"""A wheel install, away from the checkout: the packaged recipes, `aiayn`, `python -m aiayn`.

The wheel is built from a copy of the sources and installed into a fresh venv. That venv
sees the project's installed dependencies (torch from the same pinned wheel) through a
.pth line naming the project venv's site-packages: a plain path line, so the editable
install's own .pth there (which puts src/ on the path) is not processed, and `aiayn`
can come only from the wheel.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from test_quickstart import needs_sword
from typer.testing import CliRunner

import aiayn
from aiayn.cli import app
from aiayn.config.recipes import find_recipe, recipes_dir
from train_helpers import make_corpus

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 240  # seconds, for each command


def test_find_recipe_names_a_packaged_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    packaged = recipes_dir() / "tiny-test.yaml"
    assert packaged.is_file()
    assert find_recipe(Path("tiny-test")) == packaged
    assert find_recipe(Path("tiny-test.yaml")) == packaged
    (tmp_path / "tiny-test.yaml").write_text("here", encoding="utf-8")
    assert find_recipe(Path("tiny-test.yaml")) == Path("tiny-test.yaml")  # a file here wins
    assert find_recipe(Path("sub/tiny-test")) == Path("sub/tiny-test")  # folders: as given
    assert find_recipe(Path("no-such-recipe")) == Path("no-such-recipe")


def test_checkout_configs_is_the_packaged_folder():
    assert (ROOT / "configs").resolve() == recipes_dir()
    assert Path(aiayn.__file__).resolve().parent / "config" / "recipes" == recipes_dir()


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, f"{shlex.join(command)}:\n{done.stdout}\n{done.stderr}"
    return done


def unmet_build_requirements() -> list[str]:
    """pyproject.toml's build-system requirements that the project venv does not meet
    (the wheel is built offline, with the venv's own setuptools)."""
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    unmet = []
    for line in pyproject["build-system"]["requires"]:
        requirement = Requirement(line)
        try:
            if not requirement.specifier.contains(version(requirement.name), prereleases=True):
                unmet.append(line)
        except PackageNotFoundError:
            unmet.append(line)
    return unmet


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A venv with the wheel of this checkout installed; its folder and an environment."""
    unmet = unmet_build_requirements()
    if unmet:
        pytest.skip(f"building the wheel offline needs {unmet} in the project venv")
    base = tmp_path_factory.mktemp("wheel")
    tree = base / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(
        ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    pip = [sys.executable, "-m", "pip"]
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(base / "dist"), str(tree)], base, env)  # fmt: skip
    (wheel,) = (base / "dist").glob("aiayn-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for recipe in recipes_dir().glob("*.yaml"):
        assert f"aiayn/config/recipes/{recipe.name}" in names, recipe.name
    assert "aiayn/__main__.py" in names
    assert "aiayn/config/recipes/quickstart-reference.json" in names  # the reference line

    venv = base / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base, env)
    python = venv / "bin" / "python"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               base, env).stdout.strip()  # fmt: skip
    Path(site, "project-dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8"
    )
    run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        base, env)  # fmt: skip
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    where = run([str(python), "-c", "import aiayn; print(aiayn.__file__)"], elsewhere, env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # not src/
    return venv, env


@pytest.mark.slow
def test_wheel_trains_a_packaged_recipe_by_name(installed, tmp_path):
    venv, env = installed
    corpus = make_corpus(tmp_path / "corpus")
    help_ = run([str(venv / "bin" / "python"), "-m", "aiayn", "--help"], tmp_path, env)
    assert "Usage: aiayn" in help_.stdout and "quickstart" in help_.stdout

    run(["aiayn", "train", "tiny-test", f"data.corpus={corpus}", "train.max_steps=2",
         "--run", "run", "--device", "cpu", "--no-progress"], tmp_path, env)  # fmt: skip
    assert (tmp_path / "run/checkpoints/step-00000002/model.safetensors").is_file()
    translated = subprocess.run(
        ["aiayn", "translate", "run", "--beam", "1"], input="house river\n", cwd=tmp_path,
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert translated.returncode == 0, translated.stderr
    assert len(translated.stdout.splitlines()) == 1

    missing = subprocess.run(
        ["aiayn", "train", "no-such-recipe", "--run", "r2"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert missing.returncode == 1 and "no-such-recipe" in missing.stderr + missing.stdout
    assert "Traceback" not in missing.stderr


@pytest.mark.slow
@needs_sword
def test_wheel_runs_quickstart_from_another_directory(installed, tmp_path):
    venv, env = installed
    tiny = ["model.d_model=32", "model.d_ff=64", "model.n_layers=1", "model.n_heads=2",
            "train.max_tokens=512", "train.warmup=20"]  # fmt: skip
    command = ["aiayn", "quickstart", "--out", "qs", "--minutes", "0.05", "--device", "cpu",
               "--vocab-size", "1000", "--test-pairs", "4", "--average", "1", "--beam", "1"]  # fmt: skip
    for override in tiny:
        command += ["--set", override]
    first = run(command, tmp_path, env)
    results = json.loads((tmp_path / "qs/results.json").read_text(encoding="utf-8"))
    recipe = Path(results["recipe"])
    assert recipe.is_relative_to(venv) and recipe.name == "bible-en-es-cpu.yaml"
    assert recipe.read_bytes() == (recipes_dir() / recipe.name).read_bytes()

    assert "# train longer" in first.stdout  # the hint: see the test below


def test_train_longer_hint_repeats_the_run_with_twice_the_minutes(monkeypatch, tmp_path):
    """The hint the quickstart prints, parsed by the CLI, asks for the same run, longer."""
    import aiayn.apps.quickstart

    asked: list[aiayn.apps.quickstart.QuickstartConfig] = []
    monkeypatch.setattr(
        aiayn.apps.quickstart, "run_quickstart", lambda config, echo: asked.append(config)
    )
    recipe = tmp_path / "my recipe.yaml"
    args = ["quickstart", "--out", str(tmp_path / "qs"), "--minutes", "1.5", "--device", "cpu",
            "--recipe", str(recipe), "--set", "model.d_model=64", "--set", "train.seed=3",
            "--vocab-size", "1000"]  # fmt: skip
    assert CliRunner().invoke(app, args).exit_code == 0
    hint = aiayn.apps.quickstart.train_longer_command(asked[0])
    command = shlex.split(hint)
    assert command[0] == "aiayn"
    assert CliRunner().invoke(app, command[1:]).exit_code == 0
    assert asked[1] == dataclasses.replace(asked[0], minutes=3.0)
