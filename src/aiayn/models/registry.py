"""Model shapes: one spec per shape, registered by name (`ModelConfig.architecture`).

    model = build_model(cfg)          # cfg.architecture "encoder_decoder" -> Transformer

A shape is one module in this package (or a package's `aiayn.shapes` entry point)
whose `nn.Module` class, built from a `ModelConfig`, is decorated with its spec:

    @register_shape("decoder_only", task="lm")
    class DecoderOnly(nn.Module): ...

The spec bundles what the rest of aiayn needs of a shape: its module and the training
task a recipe gets by default, and what the layers above add to it, each from its own
module (`add_to_shape`): its frozen inference form, which `aiayn.inference.frozen`
adds and `freeze` builds; its user, the class that runs it for people (`Translator`,
`Generator`, `MaskFiller`), with its CLI verb, which `aiayn.apps` adds. This layer
names nothing above it: imports point down, and the layer check sees every link.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

from aiayn.config.plugins import Registry

if TYPE_CHECKING:
    from aiayn.config import ModelConfig

PARTS = ("frozen", "user", "verb")
"""What the layers above add to a shape (`add_to_shape`)."""


@dataclass(frozen=True)
class ShapeSpec:
    """One model shape, as the layers above the model see it.

    Attributes:
        name: the `ModelConfig.architecture` that selects it.
        module: the `nn.Module` class (or factory) taking a `ModelConfig`.
        task: the training task a recipe of this shape gets when it names none.
        parts: what the layers above added (`add_to_shape`): "frozen", its frozen
            inference form (`aiayn.inference.frozen`); "user", what runs it for people,
            and "verb", that user's `aiayn` command (`aiayn.apps`).
    """

    name: str
    module: Callable[[ModelConfig], nn.Module]
    task: str | None = None
    parts: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def frozen(self) -> Callable[..., nn.Module] | None:
        """The frozen inference form's class (None: `freeze` refuses the shape)."""
        return self.parts.get("frozen")

    @property
    def user(self) -> type | None:
        """What runs the shape for users (None: no command runs it)."""
        return self.parts.get("user")

    @property
    def verb(self) -> str | None:
        """The `aiayn` command of its user ("translate", "generate", "fill")."""
        return self.parts.get("verb")

    def resolve(self, part: str) -> Any:
        """The part `part` ("frozen", "user", "verb"), or None if no layer added it."""
        return self.parts.get(part)

    @property
    def user_name(self) -> str:
        """How messages name the user: "aiayn generate (Generator)"."""
        if self.user is None:
            return f"no aiayn command (architecture {self.name} has no user)"
        return f"aiayn {self.verb} ({self.user.__name__})"


SHAPES: Registry[ShapeSpec] = Registry(
    "model architecture", "aiayn.models", "aiayn.shapes", "ModelConfig.architecture"
)
"""The shapes by name; every module of this package is imported on first use."""


def register_shape(
    name: str, *, task: str | None = None, **parts: Any
) -> Callable[[Callable[[ModelConfig], nn.Module]], Callable[[ModelConfig], nn.Module]]:
    """A decorator that registers a model class as the shape `name` (see `ShapeSpec`).

    Args:
        name: the `ModelConfig.architecture` that selects it.
        task: the training task its recipes get by default.
        parts: a plug-in shape's own frozen form, user and verb, as objects (see
            `add_to_shape`); aiayn's shapes get theirs from the layers above.

    Raises:
        ValueError: `name` is registered already.
        TypeError: a part that is not one of `PARTS`, or given as a string.
    """

    def add(module: Callable[[ModelConfig], nn.Module]) -> Callable[[ModelConfig], nn.Module]:
        spec = ShapeSpec(name, module, task)
        _add_parts(spec, parts)
        SHAPES.add(name, spec)
        return module

    return add


def add_to_shape(name: str, **parts: Any) -> None:
    """Add what a layer above the models gives shape `name`, from the module that defines
    it: `aiayn.inference.frozen` its frozen form, `aiayn.apps` its user and verb.

        add_to_shape("decoder_only", frozen=FrozenDecoderOnly)
        add_to_shape("decoder_only", user=Generator, verb="generate")

    Args:
        name: the shape's registered name.
        parts: "frozen" (a class taking (model, dtype, int8_output, int8_per_token,
            int8_min_elements=...)),
            "user" (a class) and "verb" (a command name).

    Raises:
        aiayn.config.plugins.UnknownPlugin: no shape of that name.
        TypeError: a part that is not one of `PARTS`, or a class named by a string
            (an import string would hide a link from the layer check).
    """
    _add_parts(SHAPES.get(name), parts)


def _add_parts(spec: ShapeSpec, parts: dict[str, Any]) -> None:
    for part, value in parts.items():
        if part not in PARTS:
            raise TypeError(f"a shape has no part {part!r}; its parts: {', '.join(PARTS)}")
        if part != "verb" and isinstance(value, str):
            raise TypeError(
                f"{spec.name}: give its {part} as the object, from the module that defines "
                f"it (add_to_shape), not as a string to import ({value!r})"
            )
        if value is not None:
            spec.parts[part] = value


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
        aiayn.config.plugins.UnknownPlugin: no shape of that name (a ValueError listing them).
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
