"""Attention kernels: how softmax(Q K^T / sqrt(d_k)) V is computed, one module each.

    sdpa            PyTorch's fused scaled_dot_product_attention (`aiayn.nn.attention.attend`)
    explicit        the formula written out; it always has the weights
    sliding_window  local window + global tokens, linear in length (Longformer)
    linear          elu(x) + 1 feature maps, a recurrent state when decoding (Katharopoulos 2020)
    performer       FAVOR+ positive orthogonal random features (Choromanski et al. 2021)
    bigbird         block-sparse: sliding, global and random blocks (Zaheer et al. 2020)

`MultiHeadAttention` owns the projections; the kernel is the math between them, chosen
once when the model is built (`build_kernel(cfg)`), never inside `forward`. A kernel
is a subclass of `Kernel`, registered by name in its own module:

    @KERNELS.register("my_kernel")
    class MyKernel(Kernel):
        takes_bias = False       # what it supports: see `Kernel`
        def __call__(self, q, k, v, mask=None, causal=False, dropout_p=0.0,
                     need_weights=False, bias=None): ...

`ModelConfig.attention` names the kernel; `ModelConfig.attention_options` holds its own
settings, which the registry checks against the names the kernel declares (`options`)
and `build_kernel` passes to its `from_config` as keyword arguments. What a kernel
declares (`Kernel`'s class attributes: dense softmax, exact in Hugging Face's
attention, the static step, a causal form, ...) is what the rest of aiayn reads: the
model (`check_positions`), the static step, export and the analyses. Nothing else
names a kernel.

Every attention module calls its kernel for the attention itself, and differs only in
how it projects and where it keeps keys and values: the training model's
`MultiHeadAttention` and the frozen modules through `Kernel.attend_projected`, the
static decoding step through `Kernel.attend_slots` (which calls it, span by span).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

import torch
from torch import Tensor

from aiayn.config.plugins import Registry

if TYPE_CHECKING:
    from aiayn.config import ModelConfig
    from aiayn.nn.positions import PositionScheme


class CacheKind(str, Enum):
    """What a kernel keeps between incremental decoding steps (see `Kernel.cache`)."""

    KEYS_VALUES = "keys_values"  # every past key and value (`aiayn.inference.kv_cache.LayerKV`)
    STATE = "state"  # a fixed-size summary of the past (linear attention's S and z)


class DecodingStore(Protocol):
    """What attention reads of a decoding store: the blocks only duck-type the stores
    that `aiayn.inference.kv_cache` makes (or a kernel's own state, `Kernel.new_cache`).

    Every store has `static` (filled once from the encoder output, else growing),
    `length` (positions stored) and `reorder(index)` (keep batch rows `index`). A
    keys/values store also has `key` and `value`, (B, Hkv, L, D) or None while empty, and
    a growing one `append(key, value)`; a static one `group`, the query rows per stored row.
    """

    static: bool
    length: int

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index`, in that order."""
        ...


def expand_kv(k: Tensor, v: Tensor, kv_of_head: tuple[int, ...] | None) -> tuple[Tensor, Tensor]:
    """Keys and values per query head, where query heads read key/value heads irregularly.

    (B, Hkv, S, D) -> (B, H, S, D) with `kv_of_head` (after pruning); unchanged with
    None (the regular grouping, which attention handles without copies).
    """
    if kv_of_head is None:
        return k, v
    index = torch.tensor(kv_of_head, device=k.device)
    return k.index_select(1, index), v.index_select(1, index)


class SlotSpan(NamedTuple):
    """Consecutive slots of a decoding step of fixed shapes (`aiayn.inference.static_step`)
    whose attention runs in one call: what each slot may attend, from its own position.

    Attributes:
        rows: the slots (for cross-attention: the slot groups sharing a source).
        end: positions attended, from 0: the span's furthest position (or source), plus one.
        bias: float (n, 1 or H, 1, end), added to the scaled scores: -inf where a slot
            may not attend (not written yet, or source padding), else 0 or the position
            scheme's bias. Every row has a key it may attend.
    """

    rows: slice
    end: int
    bias: Tensor


class Kernel:
    """The attention math of one attention sub-layer, with what it supports declared.

    Class attributes (the declarations; the model, the static step, export and the
    analyses read them, so that nothing else needs to name a kernel):
        takes_bias: a float bias added to the scores (relative positions, ALiBi).
        takes_full_mask: a (B, H, T, S) bool mask; without it only a key-padding mask
            (B, 1, 1, S).
        has_causal: a causal form (decoder self-attention).
        full_scores: every query-key score is computed, so its cost is the dense
            formula's (`aiayn.training.budget` counts FLOPs only then).
        dense_softmax: softmax(Q K^T / sqrt(d_k) + bias) V over every key, with the
            weights on its explicit path (`need_weights`): what the analyses read.
        exact_in_hf: what Hugging Face `transformers`' attention computes, with no
            settings of its own: a model with it exports (`aiayn.io.export`).
        static_step: attends a decoding step's per-slot stores (`attend_slots`, with a
            float bias that masks): `aiayn.inference.static_step` runs it, and the
            compiled step and the continuous engine with it.
        cache: what incremental decoding keeps (`CacheKind`).
        options: the names of its settings in `ModelConfig.attention_options`, which
            `from_config` takes as keyword arguments.
    """

    takes_bias: ClassVar[bool] = True
    takes_full_mask: ClassVar[bool] = True
    has_causal: ClassVar[bool] = True
    full_scores: ClassVar[bool] = True
    dense_softmax: ClassVar[bool] = False
    exact_in_hf: ClassVar[bool] = False
    static_step: ClassVar[bool] = False
    cache: ClassVar[CacheKind] = CacheKind.KEYS_VALUES
    options: ClassVar[tuple[str, ...]] = ()

    CAPABILITIES: ClassVar[tuple[str, ...]] = (
        "dense_softmax", "exact_in_hf", "static_step", "has_causal", "takes_bias",
        "takes_full_mask", "full_scores",
    )  # fmt: skip
    """The declarations that say what a kernel supports (`capabilities`)."""

    @classmethod
    def capabilities(cls) -> dict[str, bool]:
        """What the kernel declares it supports, by the names of `CAPABILITIES`."""
        return {name: bool(getattr(cls, name)) for name in cls.CAPABILITIES}

    @classmethod
    def from_config(cls, cfg: ModelConfig, **options: Any) -> Kernel:
        """The kernel for a model of `cfg`, with its own `options` (the names it declares
        in `options`, from `ModelConfig.attention_options`, checked by the registry)."""
        return cls(**options)

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
        need_weights: bool = False,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """(B, H, T, Dv) outputs and, with `need_weights`, the (B, H, T, S) weights.

        The arguments are those of `aiayn.nn.attention.attend`.
        """
        raise NotImplementedError

    def attend_projected(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cache: DecodingStore | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
        need_weights: bool = False,
        bias: Tensor | None = None,
        kv_of_head: tuple[int, ...] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The attention of projected heads, as every attention module runs it (the
        training model's and the frozen one's): from a growing `cache` while decoding
        (`attend_cached`), else over this call's keys and values, each query head
        reading its key/value head (`kv_of_head`: irregular groups, see `expand_kv`).

        Args:
            q: (B, H, T, Dk); k, v: (B, Hkv, S, D). The others are `__call__`'s.
        """
        if cache is not None:
            return self.attend_cached(q, k, v, cache, mask, causal, need_weights, bias, kv_of_head)
        k, v = expand_kv(k, v, kv_of_head)
        return self(q, k, v, mask, causal, dropout_p, need_weights, bias)

    def attend_slots(
        self,
        q: Tensor,
        keys: Tensor,
        values: Tensor,
        spans: list[SlotSpan],
        kv_of_head: tuple[int, ...] | None = None,
    ) -> Tensor:
        """One decoding step's attention over stores kept per slot (the static step's):
        each span's queries over its slots' first `end` stored positions, with the span's
        bias (which masks what a slot may not attend), through `attend_projected`.

        Args:
            q: (N, H, T, Dk) queries (T = 1; cross-attention: a slot group's queries side
                by side); keys, values: (N, Hkv, L, D) the stores.
            spans: consecutive rows, in order, covering the N rows (`SlotSpan`).
            kv_of_head: irregular head groups (`expand_kv`).

        Returns:
            (N, H, T, Dv).
        """
        parts = [
            self.attend_projected(
                q[span.rows], keys[span.rows, :, : span.end], values[span.rows, :, : span.end],
                None, None, False, 0.0, False, span.bias, kv_of_head,
            )[0]
            for span in spans
        ]  # fmt: skip
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def new_cache(self) -> DecodingStore:
        """The kernel's own empty decoding store, for a kernel whose `cache` is
        `CacheKind.STATE` (a recurrent state with `static = False`, `length` and
        `reorder(index)`): `aiayn.inference.kv_cache` asks for it. A kernel that keeps
        keys and values (`CacheKind.KEYS_VALUES`) gets the standard store,
        `aiayn.inference.kv_cache.LayerKV`, and defines none.

        Raises:
            NotImplementedError: the kernel declares no state of its own (naming its class).
        """
        raise NotImplementedError(
            f"{type(self).__name__} makes no decoding store of its own (cache = "
            f"{self.cache.value!r}): a kernel that keeps keys and values gets the standard "
            "store from aiayn.inference.kv_cache; a CacheKind.STATE kernel defines new_cache"
        )

    def attend_cached(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cache: DecodingStore,
        mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        bias: Tensor | None = None,
        kv_of_head: tuple[int, ...] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from this step's queries, after adding this step's keys and values to
        `cache` (a growing `aiayn.inference.kv_cache.LayerKV` here; a kernel with a state of
        its own overrides this). The queries are the last T of the L + T positions.

        Args:
            q: (B, H, T, Dk) queries; k, v: (B, Hkv, T, D) this step's keys and values.
            cache: the store; kv_of_head: irregular head groups (`expand_kv`).
            The others are `__call__`'s.

        Returns:
            As `__call__`; by default the kernel over the whole prefix's keys and values.
        """
        k, v = cache.append(k, v)  # (B, Hkv, L + T, D)
        k, v = expand_kv(k, v, kv_of_head)
        return self(q, k, v, mask, causal, 0.0, need_weights, bias)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FunctionKernel(Kernel):
    """A plain attention function (`attend`'s signature) as a kernel that declares
    nothing beyond the defaults: what `MultiHeadAttention(kernel=fn)` wraps."""

    def __init__(self, function: Callable[..., tuple[Tensor, Tensor | None]]) -> None:
        self.function = function

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionKernel({getattr(self.function, '__name__', self.function)!r})"


KERNELS: Registry[type[Kernel]] = Registry(
    "attention kernel",
    __name__,
    "aiayn.kernels",
    "ModelConfig.attention",
    "ModelConfig.attention_options",
)


def kernel_class(name: str) -> type[Kernel]:
    """The kernel class registered as `name`.

    Raises:
        aiayn.config.plugins.UnknownPlugin: no kernel has that name (a ValueError listing them).
    """
    kind = KERNELS.get(str(getattr(name, "value", name)))
    if not (isinstance(kind, type) and issubclass(kind, Kernel)):
        raise TypeError(f"attention kernel {name!r} is {kind!r}, not a Kernel subclass")
    return kind


def kernel_options(cfg: ModelConfig) -> dict[str, Any]:
    """`cfg.attention_options` as a dict, checked against the kernel's declared `options`.

    Raises:
        ValueError: an option the kernel does not take, naming the ones it does.
    """
    kernel_class(cfg.attention)  # a Kernel subclass, or refused
    return KERNELS.options(cfg.attention, cfg.attention_options)


def build_kernel(cfg: ModelConfig) -> Kernel:
    """The self-attention kernel `cfg.attention`, its options checked by the registry and
    passed to its `from_config` as keyword arguments (as a position scheme's are).

    Raises:
        ValueError: an unknown kernel or option, naming what is registered or taken.
    """
    options = kernel_options(cfg)
    return kernel_class(cfg.attention).from_config(cfg, **options)


def check_positions(
    cfg: ModelConfig, kernel: Kernel | type[Kernel], positions: PositionScheme
) -> None:
    """Refuse a position scheme that needs what the kernel (or its class) does not take.

    Raises:
        ValueError: the scheme adds a bias to the scores and the kernel takes none.
    """
    if positions.adds_bias() and not kernel.takes_bias:
        raise ValueError(
            f"ModelConfig.positional {cfg.positional!r} adds a bias to every score, which "
            f"attention {cfg.attention!r} does not take; use a scheme without a score bias "
            "(rotary, sinusoidal, learned or none) or a kernel that takes one"
        )
