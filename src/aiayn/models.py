"""Model shapes: one registry from `ModelConfig.architecture` to the class that builds it.

    model = build_model(cfg)          # cfg.architecture "encoder_decoder" -> Transformer

A new shape (decoder-only, encoder-only) is a module with its `nn.Module` class
decorated `@register_model("name")`, and its module named in `_BUILTIN_SHAPES`; checkpoint
loading and the trainer then build it from a config without knowing its class.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from aiayn.config import ModelConfig

ModelFactory = Callable[["ModelConfig"], nn.Module]
_MODELS: dict[str, ModelFactory] = {}


def register_model(name: str) -> Callable[[ModelFactory], ModelFactory]:
    """Register a model class (or factory) taking a `ModelConfig`, under `name`.

    Raises:
        ValueError: `name` is registered already.
    """

    def add(factory: ModelFactory) -> ModelFactory:
        if name in _MODELS:
            raise ValueError(f"model architecture {name!r} is registered already")
        _MODELS[name] = factory
        return factory

    return add


def registered_models() -> tuple[str, ...]:
    """The names `ModelConfig.architecture` accepts."""
    _import_builtin_shapes()
    return tuple(_MODELS)


def build_model(cfg: ModelConfig) -> nn.Module:
    """A fresh, initialised model of `cfg.architecture`."""
    _import_builtin_shapes()
    return _MODELS[cfg.architecture](cfg)


# The shapes aiayn ships, registered when first asked for: they import this module
# (and aiayn.model), so importing them here at the top would be circular.
_BUILTIN_SHAPES = (
    "aiayn.model",  # encoder_decoder
    "aiayn.decoder_only",  # decoder_only
    "aiayn.encoder_only",  # encoder_only
)


def _import_builtin_shapes() -> None:
    for module in _BUILTIN_SHAPES:
        importlib.import_module(module)
