"""What incremental decoding keeps of attention between steps: keys and values.

Shape legend: B batch, Hkv key/value heads, H query heads, L positions stored,
t positions added by one step, Dk / Dv head sizes.

A decoder's `KVCache` holds one store per layer: a growing store of its
self-attention's past, chosen by the kind its kernel declares (`Kernel.cache`): a
`LayerKV` of past keys and values for the kernels that attend them, or the kernel's
own recurrent state (`Kernel.new_cache`: linear attention's S and z), and in an
encoder-decoder a static `LayerKV` of its encoder-decoder attention's keys and values,
filled once from the encoder output. Beam search follows each hypothesis's parent with
`reorder`.

The stores belong to decoding, not to the model: `aiayn.inference.decoding.new_cache`
makes a model's cache. The attention modules (`aiayn.nn`) only read and extend the store
they are handed (`length`, `static`, `key` / `value`, `append`), as
`aiayn.nn.kernels.DecodingStore` describes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from aiayn.nn.kernels import CacheKind

if TYPE_CHECKING:
    from aiayn.nn.kernels import DecodingStore, Kernel


class LayerKV:
    """Keys and values of one attention sub-layer, kept across decoding steps.

    A `static` store (encoder-decoder attention) is filled once from the encoder
    output; with `group` G > 1 each stored row serves G consecutive query rows
    (beam search's hypotheses of one sentence, in `aiayn.inference.frozen`). A growing store (decoder self-attention) gets each step's keys and
    values appended with `append`.

    `key` and `value` are (B, Hkv, L, D) tensors. A growing store keeps them as
    views of time-major (capacity, B, Hkv, D) buffers with room to grow, so that a
    step writes only its own keys and values instead of copying the whole prefix
    (torch.cat would make decoding quadratic in copies). `reorder` copies only the
    rows whose source differs while the number of rows stays (beam search's
    parents) and, when the batch shrinks, the kept prefix once, into a second
    buffer. Assigning `key` and `value` directly is allowed; the buffers are then
    rebuilt on the next append.
    """

    def __init__(
        self,
        static: bool,
        key: Tensor | None = None,
        value: Tensor | None = None,
        group: int = 1,
    ):
        self.static = static
        self.key, self.value = key, value
        self.group = group  # query rows per stored row (a static store shared by beams)
        self._buffers: list[Tensor] | None = None  # key, value, spare key, spare value
        self._view: Tensor | None = None  # the `key` the buffers back; another means stale

    @property
    def length(self) -> int:
        """Positions stored (0 while empty)."""
        return 0 if self.key is None else self.key.size(2)

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, Hkv, t, D) new keys and values after the prefix; return the whole.

        Returns:
            (B, Hkv, L + t, Dk) keys and (B, Hkv, L + t, Dv) values, views of the store.
        """
        length = 0 if self.key is None else self.key.size(2)
        end = length + key.size(2)
        if not self._backed() or end > self._buffers[0].size(0):
            self._allocate(key, value, capacity=max(2 * end, 16))
        key_buffer, value_buffer = self._buffers[:2]
        key_buffer[length:end] = key.permute(2, 0, 1, 3)  # (t, B, Hkv, Dk)
        value_buffer[length:end] = value.permute(2, 0, 1, 3)
        self._set_views(end)
        return self.key, self.value

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (beam search: follow each hypothesis's parent)."""
        if self.key is None:
            return
        if not self._backed():
            self.key = self.key.index_select(0, index)
            self.value = self.value.index_select(0, index)
            self._buffers = None
            return
        length = self.key.size(2)
        key_buffer, value_buffer, spare_key, spare_value = self._buffers
        if key_buffer.size(1) == index.numel():  # same rows, permuted and repeated
            # Copy only the rows that change (beam search: a third of them per step
            # with random weights), gathering them before any is overwritten.
            moved = (index != torch.arange(index.numel(), device=index.device)).nonzero()
            if moved.numel() > 0:
                moved = moved.squeeze(1)
                source = index[moved]
                for buffer in (key_buffer, value_buffer):
                    prefix = buffer[:length]
                    prefix.index_copy_(1, moved, prefix.index_select(1, source))
            return
        if spare_key.size(1) != index.numel():  # the batch shrinks: new buffers
            shape = (spare_key.size(0), index.numel())
            spare_key = key_buffer.new_empty(shape + key_buffer.shape[2:])
            spare_value = value_buffer.new_empty(shape + value_buffer.shape[2:])
        torch.index_select(key_buffer[:length], 1, index, out=spare_key[:length])
        torch.index_select(value_buffer[:length], 1, index, out=spare_value[:length])
        self._buffers = [spare_key, spare_value, key_buffer, value_buffer]
        self._set_views(length)

    def _backed(self) -> bool:
        return self._buffers is not None and self.key is self._view

    def _allocate(self, key: Tensor, value: Tensor, capacity: int) -> None:
        batch, heads = key.size(0), key.size(1)
        buffers = [
            key.new_empty(capacity, batch, heads, key.size(-1)),
            value.new_empty(capacity, batch, heads, value.size(-1)),
        ]
        buffers += [torch.empty_like(b) for b in buffers]
        if self.key is not None:  # the prefix so far
            length = self.key.size(2)
            buffers[0][:length] = self.key.permute(2, 0, 1, 3)
            buffers[1][:length] = self.value.permute(2, 0, 1, 3)
        self._buffers = buffers

    def _set_views(self, length: int) -> None:
        self.key = self._buffers[0][:length].permute(1, 2, 0, 3)  # (B, Hkv, L, Dk)
        self.value = self._buffers[1][:length].permute(1, 2, 0, 3)
        self._view = self.key


@dataclass
class KVCache:
    """Per decoder layer: a growing self-attention store and, in an encoder-decoder,
    a static cross-attention store (empty for a decoder-only stack)."""

    self_attention: list[DecodingStore] = field(default_factory=list)  # LayerKV, or a kernel's
    cross_attention: list[LayerKV] = field(default_factory=list)

    @classmethod
    def empty(
        cls,
        n_layers: int,
        cross: bool = True,
        group: int = 1,
        kernels: Sequence[Kernel] | None = None,
    ) -> KVCache:
        """Stores for `n_layers` layers; `cross` adds static ones holding `group` rows' keys each.

        Args:
            n_layers: decoder layers.
            cross: add a static encoder-decoder store per layer (an encoder-decoder).
            group: query rows per stored cross-attention row (`LayerKV`).
            kernels: each layer's self-attention kernel (`aiayn.nn.kernels.Kernel`); its
                declared `cache` kind picks the layer's store: a growing `LayerKV` for
                `CacheKind.KEYS_VALUES`, the kernel's own `new_cache()` for
                `CacheKind.STATE`. None: growing `LayerKV` stores.

        Returns:
            The empty cache.

        Raises:
            ValueError: as many kernels as layers are not given.
        """
        if kernels is not None and len(kernels) != n_layers:
            raise ValueError(f"{len(kernels)} kernels given for {n_layers} layers")
        stores = (
            [LayerKV(static=False) for _ in range(n_layers)]
            if kernels is None
            else [self_attention_store(kernel) for kernel in kernels]
        )
        return cls(
            self_attention=stores,
            cross_attention=[LayerKV(static=True, group=group) for _ in range(n_layers * cross)],
        )

    @property
    def length(self) -> int:
        """Positions already decoded (0 before the first step)."""
        return self.self_attention[0].length if self.self_attention else 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` in every store, in that order."""
        for store in (*self.self_attention, *self.cross_attention):
            store.reorder(index)


def self_attention_store(kernel: Kernel) -> DecodingStore:
    """An empty growing store for a self-attention sub-layer, of the kind `kernel` declares.

    Args:
        kernel: the sub-layer's kernel (`aiayn.nn.kernels.Kernel`).

    Returns:
        A `LayerKV(static=False)` for a kernel that attends past keys and values
        (`CacheKind.KEYS_VALUES`), else the kernel's own state (`kernel.new_cache()`).
    """
    if kernel.cache is CacheKind.KEYS_VALUES:
        return LayerKV(static=False)
    return kernel.new_cache()
