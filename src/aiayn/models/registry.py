"""Model shapes: one spec per shape, registered by name (`ModelConfig.architecture`).

    model = build_model(cfg)          # cfg.architecture "encoder_decoder" -> Transformer

A shape is one module in this package (or a package's `aiayn.shapes` entry point)
whose `nn.Module` class, built from a `ModelConfig`, is decorated with its spec:

    @register_shape("decoder_only", verb="generate", task="lm",
                    frozen="aiayn.inference.frozen:FrozenDecoderOnly",
                    user="aiayn.apps.generate:Generator")
    class DecoderOnly(nn.Module): ...

The spec bundles what the rest of aiayn needs of a shape: its module; its frozen
inference form, which `aiayn.inference.frozen.freeze` builds; its user, the class that
runs it for people (`Translator`, `Generator`, `MaskFiller`), with its CLI verb; and
the training task a recipe gets by default. The frozen form and the user live in
layers above this one, so the spec names them as "module:attribute" and the layers
that use them resolve the name (`ShapeSpec.resolve`): imports still point down.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from aiayn.plugins import Registry

if TYPE_CHECKING:
    from aiayn.config import ModelConfig


@dataclass(frozen=True)
class ShapeSpec:
    """One model shape, as the layers above the model see it.

    Attributes:
        name: the `ModelConfig.architecture` that selects it.
        module: the `nn.Module` class (or factory) taking a `ModelConfig`.
        frozen: "module:Class" of its frozen inference form (None: `freeze` refuses it).
        user: "module:Class" of what runs it for users (None: no command runs it).
        verb: the `aiayn` command of its user ("translate", "generate", "fill").
        task: the training task a recipe of this shape gets when it names none.
    """

    name: str
    module: Callable[[ModelConfig], nn.Module]
    frozen: str | None = None
    user: str | None = None
    verb: str | None = None
    task: str | None = None

    def resolve(self, part: str) -> Any:
        """The object `frozen` or `user` names (imported now), or None if the shape has none."""
        reference = getattr(self, part)
        if reference is None:
            return None
        module, _, attribute = reference.partition(":")
        return getattr(importlib.import_module(module), attribute)

    @property
    def user_name(self) -> str:
        """How messages name the user: "aiayn generate (Generator)"."""
        if self.user is None:
            return f"no aiayn command (architecture {self.name} has no user)"
        return f"aiayn {self.verb} ({self.user.rpartition(':')[2]})"


SHAPES: Registry[ShapeSpec] = Registry(
    "model architecture", "aiayn.models", "aiayn.shapes", "ModelConfig.architecture"
)
"""The shapes by name; every module of this package is imported on first use."""


def register_shape(
    name: str,
    *,
    frozen: str | None = None,
    user: str | None = None,
    verb: str | None = None,
    task: str | None = None,
) -> Callable[[Callable[[ModelConfig], nn.Module]], Callable[[ModelConfig], nn.Module]]:
    """A decorator that registers a model class as the shape `name` (see `ShapeSpec`).

    Raises:
        ValueError: `name` is registered already.
    """

    def add(module: Callable[[ModelConfig], nn.Module]) -> Callable[[ModelConfig], nn.Module]:
        SHAPES.add(name, ShapeSpec(name, module, frozen, user, verb, task))
        return module

    return add


def register_model(name: str) -> Callable[[Callable[[ModelConfig], nn.Module]], Any]:
    """Register a model class (or factory) taking a `ModelConfig` under `name`, with no
    frozen form, user or task (`register_shape` gives those).

    Raises:
        ValueError: `name` is registered already.
    """
    return register_shape(name)


def registered_models() -> tuple[str, ...]:
    """The names `ModelConfig.architecture` accepts."""
    return SHAPES.names()


def shape_spec(architecture: str) -> ShapeSpec:
    """The spec of `architecture`.

    Raises:
        aiayn.plugins.UnknownPlugin: no shape of that name (a ValueError listing them).
    """
    return SHAPES.get(architecture)


def spec_of(model: nn.Module) -> ShapeSpec:
    """The spec whose module is exactly `model`'s class: a subclass is not its parent.

    Raises:
        TypeError: `model`'s class is registered as no shape, naming it and the shapes.
    """
    for _, spec in SHAPES.items():
        if type(model) is spec.module:
            return spec
    raise TypeError(
        f"{type(model).__name__} is not a registered model shape (registered: "
        + ", ".join(f"{name} ({spec.module.__name__})" for name, spec in SHAPES.items())
        + "); register its class with aiayn.models.register_shape"
    )


def build_model(cfg: ModelConfig) -> nn.Module:
    """A fresh, initialised model of `cfg.architecture`.

    Raises:
        ValueError: an unknown architecture, position scheme or attention kernel (each
            named with what is registered), or a combination they refuse.
    """
    return shape_spec(cfg.architecture).module(cfg)
