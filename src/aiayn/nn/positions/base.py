"""The contract every position scheme meets, and the registry that builds them by name.

A scheme can act at three places of a Transformer stack, and overrides only those it uses:

- `embeddings`: vectors added to the scaled token embeddings (section 3.5 of the paper);
- `rotate`: a position-dependent rotation of self-attention queries and keys (RoPE);
- `attention_bias`: a float added to the self-attention scores (T5, ALiBi).

Each stack (the encoder's, the decoder's) builds its own scheme with `build_positions`;
`causal=True` tells the scheme that it serves the decoder's masked self-attention.
A new scheme is one module in this package (or a package's `aiayn.positions` entry
point) that subclasses `PositionScheme` and registers a factory; no list names it:

    @register("my_scheme")
    def _my_scheme(cfg: ModelConfig, causal: bool) -> PositionScheme:
        return MySchemePositions(d_model=cfg.d_model)

Shape legend: L positions, D d_model, B batch, H heads, T queries, S keys, Dk query/key head size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import Tensor, nn

from aiayn.config.plugins import Registry

if TYPE_CHECKING:
    from aiayn.config import ModelConfig


class PositionScheme(nn.Module):
    """How token positions enter a Transformer stack.

    Subclasses override the hooks they use; the defaults add nothing. A scheme that
    overrides `rotate` sets the class attribute `rotary = True`, so that the attention
    layers know to call it.
    """

    rotary: bool = False  # True if `rotate` must be applied to self-attention queries and keys

    def reset_parameters(self) -> None:
        """Draw the scheme's parameters afresh; nothing to do for a scheme without any.

        A model's own initialisation loop should skip position schemes and call this
        instead: a scheme's `nn.Embedding` is not a token embedding (it has no padding row).
        """

    def embeddings(self, length: int, offset: int = 0) -> Tensor | None:
        """Vectors added to the scaled token embeddings.

        Args:
            length: L, how many consecutive positions.
            offset: the first position (tokens already in a decoding cache).

        Returns:
            (L, D) for positions offset .. offset + L - 1, or None if the scheme adds none.
        """
        return None

    def rotate(self, x: Tensor, offset: int = 0) -> Tensor:
        """Rotate self-attention queries or keys by their positions; the identity by default.

        Args:
            x: (B, H, L, Dk) queries or keys at positions offset .. offset + L - 1.
            offset: the position of x's first row.

        Returns:
            A tensor of x's shape and dtype.
        """
        return x

    def attention_bias(self, q_len: int, k_len: int) -> Tensor | None:
        """A float added to the self-attention scores, after the 1/sqrt(d_k) scaling.

        Queries are the last q_len of k_len positions: query i stands at position
        k_len - q_len + i, the earlier keys come from a cache (as in `aiayn.nn.masks.causal_mask`).

        Args:
            q_len: T, the number of queries.
            k_len: S, the number of keys.

        Returns:
            (H, T, S) float, or None if the scheme adds no bias.
        """
        return None

    def adds_bias(self) -> bool:
        """Whether the scheme adds a bias to the scores (it overrides `attention_bias`):
        an attention kernel must take one (`aiayn.nn.kernels.check_positions`)."""
        return type(self).attention_bias is not PositionScheme.attention_bias


PositionFactory = Callable[..., PositionScheme]
"""(cfg, causal, **options) -> scheme; causal is True for the decoder's self-attention
stack, and the options are the scheme's own (`ModelConfig.position_options`, the names
it declares with `register(name, options=...)`)."""

POSITIONS: Registry[PositionFactory] = Registry(
    "position scheme",
    "aiayn.nn.positions",
    "aiayn.positions",
    "ModelConfig.positional",
    "ModelConfig.position_options",
)
"""The position schemes by `ModelConfig.positional`: every module of this package is
imported on first use (see `aiayn.config.plugins`)."""


def register(
    name: str, options: tuple[str, ...] = ()
) -> Callable[[PositionFactory], PositionFactory]:
    """A decorator that registers a position scheme's factory under `name`
    (`POSITIONS.register`).

    Args:
        name: the value of `ModelConfig.positional` that selects the scheme.
        options: the names of the scheme's own settings; the factory takes them as
            keyword arguments, from `ModelConfig.position_options`.

    Returns:
        The decorator; it returns the factory unchanged.

    Raises:
        ValueError: if `name` is empty or already registered.
    """
    return POSITIONS.register(name, options)


def registered() -> tuple[str, ...]:
    """The names of the registered position schemes, sorted."""
    return POSITIONS.names()


def build_positions(name: str, cfg: ModelConfig, causal: bool) -> PositionScheme:
    """Build the position scheme registered under `name` for one stack.

    Args:
        name: a registered scheme name (`registered()` lists them).
        cfg: the model's configuration; the factory reads the sizes it needs, and gets
            `cfg.position_options` as keyword arguments when `name` is `cfg.positional`.
        causal: True for the decoder's (masked) self-attention stack, False for the encoder's.

    Returns:
        A fresh `PositionScheme`.

    Raises:
        ValueError: if no scheme is registered under `name` (the message lists the
            names), or an option the scheme does not declare.
        TypeError: if the factory returns something other than a `PositionScheme`.
    """
    chosen = getattr(cfg, "positional", None) == name  # cfg may hold only the sizes
    given = getattr(cfg, "position_options", ()) if chosen else ()
    options = POSITIONS.options(name, dict(given))
    scheme = POSITIONS.get(name)(cfg, causal, **options)
    if not isinstance(scheme, PositionScheme):
        raise TypeError(
            f"the factory of position scheme {name!r} returned {type(scheme).__name__}, "
            "not a PositionScheme"
        )
    return scheme


# ----- helpers shared by the schemes ---------------------------------------------------


def check_span(length: int, offset: int, max_len: int, scheme: str) -> None:
    """Refuse positions offset .. offset + length - 1 outside a table of max_len rows.

    Raises:
        ValueError: naming the scheme, the span and max_len.
    """
    if length < 0 or offset < 0 or offset + length > max_len:
        raise ValueError(
            f"{scheme} covers positions 0 .. {max_len - 1} (max_len={max_len}), "
            f"asked for length={length} at offset={offset}"
        )
