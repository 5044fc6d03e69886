"""The training recipes that ship with aiayn, as package data beside this file.

A wheel install has them too, so `aiayn quickstart` and `aiayn train bible-en-es-cpu`
work from any directory; a checkout's top-level `configs/` is a link to this folder.
"""

from __future__ import annotations

from pathlib import Path


def recipes_dir() -> Path:
    """The folder of the packaged recipes (`*.yaml`)."""
    return Path(__file__).resolve().parent


def recipe_names() -> list[str]:
    """The packaged recipes' names (their file names without `.yaml`), sorted."""
    return sorted(path.stem for path in recipes_dir().glob("*.yaml"))


def find_recipe(path: Path) -> Path:
    """`path` itself if it exists, else the packaged recipe it names, if one does.

    `bible-en-es-cpu` and `bible-en-es-cpu.yaml` both name the packaged
    `aiayn/config/recipes/bible-en-es-cpu.yaml`; a path with a folder is never looked up.
    """
    if path.exists() or path.parent != Path("."):
        return path
    packaged = recipes_dir() / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
    return packaged if packaged.is_file() else path
