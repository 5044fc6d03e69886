"""The module paths of the flat layout, kept importable for one release.

aiayn's modules moved into subpackages by layer (`nn`, `models`, `io`, `inference`,
`training`, `analysis`, `apps`; the ground floor's into `config` and `data`).
`import aiayn.attention` and the other old paths still work: they give the module at
its new path (the same module object, so patching one patches the other) with a
`DeprecationWarning` that names the new path. This module is removed in the next
release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {
    "aiayn.attention": "aiayn.nn.attention",
    "aiayn.layers": "aiayn.nn.layers",
    "aiayn.masks": "aiayn.nn.masks",
    "aiayn.dropout": "aiayn.nn.dropout",
    "aiayn.positions": "aiayn.nn.positions",
    "aiayn.sliding_window": "aiayn.nn.kernels.sliding_window",
    "aiayn.nn.kv_cache": "aiayn.inference.kv_cache",  # decoding state leaves the blocks
    "aiayn.model": "aiayn.models.encoder_decoder",
    "aiayn.decoder_only": "aiayn.models.decoder_only",
    "aiayn.encoder_only": "aiayn.models.encoder_only",
    "aiayn.checkpoint": "aiayn.io.checkpoint",
    "aiayn.marian": "aiayn.io.marian",
    "aiayn.hf_models": "aiayn.io.hf_models",
    "aiayn.hf_tokenizer": "aiayn.data.hf_tokenizer",
    "aiayn.search": "aiayn.inference.search",
    "aiayn.shortlist": "aiayn.inference.shortlist",
    "aiayn.threads": "aiayn.inference.threads",
    "aiayn.train": "aiayn.training.trainer",
    "aiayn.train_state": "aiayn.training.state",
    "aiayn.stopping": "aiayn.training.stopping",
    "aiayn.optim": "aiayn.training.optim",
    "aiayn.loss": "aiayn.training.loss",
    "aiayn.recipe": "aiayn.training.recipe",
    "aiayn.tasks": "aiayn.training.tasks",
    "aiayn.distributed": "aiayn.training.distributed",
    "aiayn.metrics": "aiayn.training.metrics",
    "aiayn.precision": "aiayn.training.precision",
    "aiayn.budget": "aiayn.training.budget",
    "aiayn.evaluate": "aiayn.training.evaluate",
    "aiayn.heads": "aiayn.analysis.heads",
    "aiayn.pruning": "aiayn.analysis.pruning",
    "aiayn.viz": "aiayn.analysis.viz",
    "aiayn.translate": "aiayn.apps.translate",
    "aiayn.generate": "aiayn.apps.generate",
    "aiayn.fill": "aiayn.apps.fill",
    "aiayn.model_use": "aiayn.apps.model_use",
    "aiayn.quickstart": "aiayn.apps.quickstart",
    "aiayn.serve": "aiayn.apps.serve",
    "aiayn.explorer": "aiayn.apps.explorer",
    # the top level's last modules, for a top level of packages
    "aiayn.files": "aiayn.data.files",
    "aiayn.plugins": "aiayn.config.plugins",
    "aiayn.devices": "aiayn.config.devices",
    "aiayn.configs": "aiayn.config.recipes",
}
"""Old module path -> new one; a moved package's submodules follow it
(`aiayn.serve.app` -> `aiayn.apps.serve.app`)."""


def new_path(old: str) -> str | None:
    """The new path of the old module path `old`, or None if it did not move."""
    if old in MOVED:
        return MOVED[old]
    package = old.rpartition(".")[0]
    while package:
        if package in MOVED:
            return f"{MOVED[package]}.{old[len(package) + 1 :]}"
        package = package.rpartition(".")[0]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module at its new path is already executed


class MovedModules(importlib.abc.MetaPathFinder):
    """Finds the old paths of `MOVED` and answers with the modules at their new paths."""

    def find_spec(self, fullname, path=None, target=None):
        new = new_path(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the finder first on `sys.meta_path` (once): before the path finder, which would
    load a second copy of a moved package's submodule under its old name."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
