"""What every config dataclass shares: validation of field types, enum members and
seeds, and conversion to and from plain types (YAML, JSON).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from enum import Enum
from typing import Any, TypeVar

EnumT = TypeVar("EnumT", bound=Enum)


def enum_member(kind: type[EnumT], value: Any, name: str) -> EnumT:
    """`value` as a member of the enum `kind` (its value or itself).

    Raises:
        ValueError: naming `name`, the choices and `value`.
    """
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(member.value for member in kind)
        raise ValueError(f"{name} must be one of {choices}, got {value!r}") from None


def plain(value: Any) -> Any:
    """A config value as plain types (enums as their values, tuples as lists), for YAML/JSON."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value


def config_to_dict(config: Any) -> dict[str, Any]:
    """A config dataclass as plain types (see `plain`), for YAML/JSON."""
    return {k: plain(v) for k, v in dataclasses.asdict(config).items()}


def config_from_dict(cls: type, values: dict[str, Any]) -> Any:
    """Build the config dataclass `cls` from `values`; unknown keys raise a ValueError naming them."""
    unknown = sorted(set(values) - config_fields(cls))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
    return cls(**values)


def config_fields(cls: type) -> set[str]:
    """The names a config dataclass is built from: its fields, and the old spellings it
    still reads (init-only, e.g. `ModelConfig.attention_window`)."""
    return set(inspect.signature(cls).parameters)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fits(value: Any, kind: Any) -> bool:
    """Whether `value` is of the annotated type `kind` (lists stand for tuples, as in YAML)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:  # a bool is an int to Python, not to a recipe
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return isinstance(value, kind | str)  # the value's spelling is `enum_member`'s to check
    if origin is tuple:
        if not isinstance(value, tuple | list):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(v, args[0]) for v in value)
        return len(value) == len(args) and all(
            _fits(v, a) for v, a in zip(value, args, strict=True)
        )
    return True


def _type_words(kind: Any) -> str:
    """An annotated type as a recipe's author would say it: "an integer or null"."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_words(arg) for arg in args)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "one of " + ", ".join(member.value for member in kind)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of ({_type_words(args[0])})"
        return f"a list of {len(args)} ({', '.join(_type_words(a) for a in args)})"
    words = {type(None): "null", bool: "true or false", int: "an integer", float: "a number"}
    return words.get(kind, "a string" if kind is str else str(kind))


def check_field_types(config: Any) -> None:
    """Refuse a field of a config dataclass whose value is not of its annotated type.

    Run first in `__post_init__`, so that a quoted number in YAML ("0.1") or a bool
    where an integer belongs (`keep_last: true`) is named, not met later as a
    TypeError deep inside a comparison.

    Raises:
        ValueError: naming the class, the field, the type expected and the value.
    """
    cls = type(config)
    kinds = _field_types(cls)
    for field in dataclasses.fields(cls):
        name, kind = field.name, kinds[field.name]
        value = getattr(config, name)
        if not _fits(value, kind):
            raise ValueError(f"{cls.__name__}.{name} must be {_type_words(kind)}, got {value!r}")


SEED_MAX = 2**63 - 1
"""The largest seed taken: torch's generators take up to 2**64 - 1, and a run adds its
rank to its seed; NumPy's refuse negative seeds."""


def check_seed(value: int, name: str) -> None:
    """Refuse a seed that a random generator would not take (torch, NumPy, `random`).

    Args:
        value: the seed.
        name: what to call it in the error (`DecodeConfig.seed`, `--seed`).

    Raises:
        ValueError: naming `name`, its range [0, 2**63 - 1] and the value.
    """
    if not 0 <= value <= SEED_MAX:
        raise ValueError(f"{name} must lie in [0, 2**63 - 1], got {value}")
