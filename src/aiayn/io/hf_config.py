"""Reading another toolkit's checkpoint directory without trusting it.

`aiayn.io.marian` and `aiayn.io.hf_models` convert directories as `transformers` saves
them. What such a directory holds is checked here before anything is built from
it, each error naming the file and the field or tensor:

- config.json must be a JSON object; each field the conversion reads has a type
  and a range (`ConfigFields`): a size is a positive integer, and a position count
  at most `MAX_POSITIONS`, so that an absurd one is refused before allocating;
- each tensor taken is floating point and finite (`checked_tensor`);
- the model the config describes has the stored tensors' shapes, compared on the
  meta device (no memory) before the model is built for real (`check_shapes`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

MAX_POSITIONS = 65_536
"""The most positions a converted config may ask for: far more than the checkpoints
converted here use (GPT-2 1024, BERT and opus-mt 512); a sinusoid table of this
many positions at d_model 1024 takes 256 MiB."""

_MISSING = object()


def read_json_object(path: Path, error: type[ValueError]) -> dict[str, Any]:
    """The JSON object in `path`.

    Raises:
        error: naming the file, when it is not UTF-8 JSON or holds no object.
    """
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise error(f"{path} is not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise error(f"{path} holds a JSON {type(value).__name__}, not an object of fields")
    return value


class ConfigFields:
    """The fields of one config file, each read with its type and range.

    Args:
        values: the file's fields.
        where: how errors name the file ("config.json", "gpt2 config.json").
        error: the exception class raised.
    """

    def __init__(self, values: Mapping[str, Any], where: str, error: type[ValueError]) -> None:
        self.values, self.where, self.error = values, where, error

    def get(self, field: str, default: Any = None) -> Any:
        """A field as it is, or `default`."""
        return self.values.get(field, default)

    def _value(self, field: str, default: Any) -> Any:
        if field in self.values and self.values[field] is not None:
            return self.values[field]
        if default is _MISSING:
            raise self.error(f"{self.where} has no field {field}")
        return default

    def _fail(self, field: str, rule: str) -> ValueError:
        return self.error(f"{self.where} field {field}={self.values.get(field)!r}: must be {rule}")

    def int(
        self, field: str, default: Any = _MISSING, low: int = 1, high: int | None = None
    ) -> int:
        """An integer field in [low, high] (`default` when absent or null; a default of
        None is given back as is)."""
        value = self._value(field, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(field, "an integer")
        if value < low or (high is not None and value > high):
            raise self._fail(field, f"in [{low}, {high if high is not None else 'inf'}]")
        return value

    def float(
        self, field: str, default: Any = _MISSING, low: float = 0.0, high: float = math.inf
    ) -> float:
        """A finite number field in [low, high] (`default` when absent or null)."""
        value = self._value(field, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(field, "a number")
        if not (math.isfinite(value) and low <= value <= high):
            raise self._fail(field, f"a finite number in [{low:g}, {high:g}]")
        return float(value)

    def probability(self, field: str, default: Any = _MISSING) -> float:
        """A dropout-like field in [0, 1)."""
        value = self.float(field, default, 0.0, 1.0)
        if value >= 1.0:
            raise self._fail(field, "in [0, 1)")
        return value


def checked_tensor(name: str, tensor: torch.Tensor, where: Path, error: type[ValueError]):
    """`tensor`, if it is floating point and finite.

    Raises:
        error: naming `where` and the tensor: int or bool weights would be cast
            silently, NaN or infinite ones give nan or empty outputs.
    """
    if not tensor.is_floating_point():
        raise error(f"{where}: tensor {name} is {tensor.dtype}, not floating point")
    if not bool(torch.isfinite(tensor).all()):
        raise error(f"{where}: tensor {name} holds NaN or infinite values")
    return tensor


def check_shapes(
    build: Callable[[], nn.Module],
    state: Mapping[str, torch.Tensor],
    where: Path,
    error: type[ValueError],
) -> None:
    """Refuse weights that do not fit the model `build` makes, before it is made for real.

    `build` runs on the meta device (shapes, no memory), so that a config asking for
    an absurd size costs nothing.

    Raises:
        error: naming the first tensor of another shape, missing or left over.
    """
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in build().state_dict().items()}
    for name, shape in expected.items():
        if name not in state:
            raise error(f"the weights in {where} have no tensor for {name} (shape {shape})")
        if tuple(state[name].shape) != shape:
            raise error(
                f"the weights in {where} do not fit their config: {name} is "
                f"{tuple(state[name].shape)} in the file, {shape} by the config"
            )
    extra = sorted(set(state) - set(expected))
    if extra:
        raise error(f"the weights in {where} have tensors the config has no place for: {extra[0]}")
