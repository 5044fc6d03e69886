"""Hook points: named places in a model where an activation can be read or replaced.

The idea is TransformerLens's: each place is an identity module, a `HookPoint`, and
its name is its path in the model (`model.named_modules()`), for example

    encoder.embedding.hook_embed             token embeddings with positions, (B, T, D)
    encoder.layers.0.hook_resid_pre          the residual stream entering layer 0
    encoder.layers.0.self_attn.hook_q        queries per head, (B, H, T, Dk)
    encoder.layers.0.self_attn.hook_weights  attention weights, (B, H, T, S)
    encoder.layers.0.self_attn.hook_z        each head's output before W^O, (B, H, T, Dv)
    decoder.layers.1.feed_forward.hook_hidden  the FFN's hidden layer, (B, T, F); absent with d_ff 0
    hook_logits                              the pre-softmax logits, (B, T, V)

A function hooked on a point gets the activation and the point's name; it returns
None to read it, or a tensor of the same shape to replace it downstream:

    with hooks(model, {"*.self_attn.hook_weights": keep}):  # fnmatch patterns
        model(src, tgt_in)
    logits, cache = run_with_cache(model, src, tgt_in, names="*.hook_resid_post")

Nothing listens by default, and then a point is not even called (`hooked`), so the
model's speed is unchanged. Attention weights exist only on a kernel's explicit path:
while `hook_weights` is listened to, the attention sub-layer asks its kernel for them
(as `need_weights` does), and a replaced weight matrix gives the output `weights @ v`.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from torch import Tensor, nn

HookFunction = Callable[[Tensor, str], Tensor | None]
"""fn(activation, name) -> None to read it, or a replacement of the same shape."""


class HookPoint(nn.Module):
    """An identity module that marks a place where an activation can be read or replaced."""

    def forward(self, x: Tensor) -> Tensor:
        return x

    def listened(self) -> bool:
        """Whether a forward hook is registered here (PyTorch keeps them in `_forward_hooks`)."""
        return bool(self._forward_hooks)


def hooked(point: HookPoint, x: Tensor) -> Tensor:
    """`point(x)` when something listens to the point, else `x` itself, with no module call."""
    return point(x) if point._forward_hooks else x


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of `model` by its name, in model order."""
    return {name: module for name, module in model.named_modules() if isinstance(module, HookPoint)}


def _matching(model: nn.Module, pattern: str) -> dict[str, HookPoint]:
    points = hook_points(model)
    found = {name: point for name, point in points.items() if fnmatch.fnmatchcase(name, pattern)}
    if not found:
        raise ValueError(
            f"no hook point matches {pattern!r}; there are {len(points)}, e.g. "
            + ", ".join(list(points)[:4])
        )
    return found


@contextlib.contextmanager
def hooks(model: nn.Module, functions: Mapping[str, HookFunction]) -> Iterator[None]:
    """Run `functions` on the hook points their patterns match, inside the `with` block.

    Args:
        functions: a hook point's name, or an `fnmatch` pattern of names, to a function
            (see `HookFunction`).

    Raises:
        ValueError: a pattern matches no hook point (naming a few that exist).
    """
    handles = []
    try:
        for pattern, function in functions.items():
            for name, point in _matching(model, pattern).items():

                def call(_module, _inputs, output, name=name, function=function):
                    return function(output, name)

                handles.append(point.register_forward_hook(call))
        yield
    finally:
        for handle in handles:
            handle.remove()


def run_with_cache(
    model: nn.Module, *inputs: Any, names: str | Iterable[str] = "*", **kwargs: Any
) -> tuple[Any, dict[str, Tensor]]:
    """`model(*inputs, **kwargs)`, and the activations at the hook points `names` match.

    Returns:
        The model's output and {hook point name: activation (detached)}, in the order
        they were computed.
    """
    patterns = [names] if isinstance(names, str) else list(names)
    cache: dict[str, Tensor] = {}

    def keep(activation: Tensor, name: str) -> None:
        cache[name] = activation.detach()

    with hooks(model, dict.fromkeys(patterns, keep)):
        output = model(*inputs, **kwargs)
    return output, cache
