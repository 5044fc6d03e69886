"""BigBird attention (Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences").

Block-sparse attention, section 2 and appendix D: the sequence is cut into blocks of b
positions, and every query of block i attends the keys of

    - the global blocks 0 ... g - 1 (global tokens, BigBird-ITC's pattern);
    - the sliding blocks i - w ... i + w (w = 1: the paper's three sliding blocks);
    - r random blocks, drawn among the others;

while the queries of a global block attend every key. Softmax is taken over the keys a
query attends (a key-padding mask removes padding); the scaling is the paper's
1 / sqrt(Dk).

How it stays linear: the K = g + 2w + 1 + r key blocks of each query block are gathered
into one (K b)-long row of keys, and the n query blocks go to
`aiayn.nn.attention.attend` as one batch of n small attention problems, (b, K b)
scores each: O(T K b) time and memory, never a (T, S) mask or score matrix. The global
queries are g b rows against all S keys: O(g b S), linear in S as well.

The random blocks are fixed per layer: each kernel draws a seed when it is built (from
torch's random state, so a seeded build gives the same model) and keeps it as a buffer,
saved with the model; the pattern for n blocks is a function of that seed and n only
(`block_pattern`), so a reloaded model attends the same keys, at every length. Each
batch row takes the pattern of its own length (up to its last real key), not of the
padded batch's, so that a sequence attends the same keys whatever it is batched with.

Shape legend: B batch, H query heads, Hkv key/value heads, T queries = S keys,
Dk query/key head size, Dv value head size, b block size, n blocks, K key blocks per
query block (slots; the unused ones are masked).

Departures from the paper: the global tokens are the first g blocks (ITC puts global
blocks at both ends); the random blocks are fixed per layer rather than redrawn; a
random block is never one of the query block's global or sliding blocks (so no key is
counted twice), and fewer than r are drawn when fewer remain. There is no causal form:
a causal pattern would change which random blocks may be drawn and needs a decoding
cache of its own; `causal=True` is refused by name. A key-padding mask only, (B, 1, 1,
S), and no score bias.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.nn.kernels import KERNELS, Kernel
from aiayn.nn.kernels.sdpa import attend

if TYPE_CHECKING:
    from aiayn.config import ModelConfig


@KERNELS.register("bigbird")
class BigBirdKernel(Kernel, nn.Module):
    """Block-sparse attention: global, sliding and random blocks (bidirectional only).

    An `nn.Module` as well as a kernel, so that its random pattern's seed (`seed`, a
    buffer) is saved with the model.

    Args:
        block_size: b >= 1 positions per block.
        num_random_blocks: r >= 0 random key blocks per query block.
        num_global_blocks: g >= 0 global blocks at the start.
        window_blocks: w >= 0 sliding blocks on each side of a query block's own.

    Raises:
        ValueError: an option out of range, naming it (`ModelConfig.attention_options`).
    """

    takes_bias = False
    takes_full_mask = False
    has_causal = False
    full_scores = False
    options = ("block_size", "num_random_blocks", "num_global_blocks", "window_blocks")

    def __init__(
        self,
        block_size: int = 64,
        num_random_blocks: int = 3,
        num_global_blocks: int = 1,
        window_blocks: int = 1,
    ) -> None:
        for name, value, least in (
            ("block_size", block_size, 1),
            ("num_random_blocks", num_random_blocks, 0),
            ("num_global_blocks", num_global_blocks, 0),
            ("window_blocks", window_blocks, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(
                    f"ModelConfig.attention_options: bigbird's {name} must be an integer "
                    f">= {least}, got {value!r}"
                )
        nn.Module.__init__(self)
        self.block_size, self.num_random_blocks = block_size, num_random_blocks
        self.num_global_blocks, self.window_blocks = num_global_blocks, window_blocks
        self.register_buffer("seed", torch.randint(2**31, (), dtype=torch.long))
        self._patterns: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}

    @classmethod
    def from_config(cls, cfg: ModelConfig, **options: Any) -> BigBirdKernel:
        return cls(**options)

    def __repr__(self) -> str:
        return (
            f"BigBirdKernel(block_size={self.block_size}, "
            f"num_random_blocks={self.num_random_blocks}, "
            f"num_global_blocks={self.num_global_blocks}, window_blocks={self.window_blocks})"
        )

    def block_pattern(self, n_blocks: int) -> tuple[Tensor, Tensor]:
        """The key blocks each query block attends, for a sequence of `n_blocks` blocks.

        Slots: the g global blocks, the 2w + 1 sliding blocks i - w ... i + w, then r
        random blocks drawn (without repeats) among the blocks in neither, from a
        generator seeded by this layer's `seed`; a slot out of range or repeating a
        global block is marked unused. The rows of global query blocks are not used
        (they attend every key).

        Args:
            n_blocks: n >= 1.

        Returns:
            (n, K) long block indices and (n, K) bool, True where the slot is used; on
            the CPU, computed once per (seed, n).
        """
        key = (int(self.seed), n_blocks)
        if key not in self._patterns:
            self._patterns[key] = self._draw_pattern(*key)
        return self._patterns[key]

    def _draw_pattern(self, seed: int, n: int) -> tuple[Tensor, Tensor]:
        g, w, r = self.num_global_blocks, self.window_blocks, self.num_random_blocks
        generator = torch.Generator().manual_seed(seed)
        index = torch.zeros(n, g + 2 * w + 1 + r, dtype=torch.long)
        used = torch.zeros(index.shape, dtype=torch.bool)
        blocks = torch.arange(n)
        for i in range(n):
            sliding = torch.arange(i - w, i + w + 1)
            slots = torch.cat([torch.arange(g), sliding])
            ok = (slots < n) & (slots >= 0)
            ok[g:] &= sliding >= g  # a global block is not attended twice
            index[i, : len(slots)] = slots.clamp(0, n - 1)
            used[i, : len(slots)] = ok
            others = blocks[(blocks >= g) & ((blocks - i).abs() > w)]
            drawn = others[torch.randperm(len(others), generator=generator)[:r]]
            index[i, len(slots) : len(slots) + len(drawn)] = drawn
            used[i, len(slots) : len(slots) + len(drawn)] = True
        return index, used

    def _row_patterns(self, key_mask: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """Each batch row's pattern, (B, n, K) block indices and used slots: the pattern of
        its own length (up to its last real key), so that a sequence attends the same
        keys whatever its batch is padded to; query blocks past that are unused."""
        b, batch = self.block_size, key_mask.size(0)
        positions = torch.arange(1, key_mask.size(1) + 1, device=key_mask.device)
        ends = (key_mask * positions).amax(dim=1)  # (B,): one past the last real key
        blocks = [max(1, math.ceil(end / b)) for end in ends.tolist()]
        slots = self.num_global_blocks + 2 * self.window_blocks + 1 + self.num_random_blocks
        index = torch.zeros(batch, n, slots, dtype=torch.long)
        used = torch.zeros(batch, n, slots, dtype=torch.bool)
        for row, own in enumerate(blocks):
            index[row, :own], used[row, :own] = self.block_pattern(own)
        return index.to(key_mask.device), used.to(key_mask.device)

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
        self._check(q, k, mask, causal, bias)
        batch, n_heads, t_len, d_k = q.shape
        n_kv_heads, d_v = k.size(1), v.size(-1)
        b = self.block_size
        n = math.ceil(t_len / b)
        pad = n * b - t_len  # padded positions: masked keys, dropped queries
        key_mask = torch.ones(batch, t_len, dtype=torch.bool, device=q.device)
        if mask is not None:
            key_mask = mask[:, 0, 0, :].expand(batch, t_len)
        index, used = self._row_patterns(key_mask, n)  # (B, n, K) each
        slots = index.size(-1)
        rows_of = torch.arange(batch, device=q.device)[:, None, None]  # (B, 1, 1)

        # (B, Hkv, n b, D) -> (B, Hkv, n, b, D) -> each row's query blocks' K key blocks,
        # (B, n, K, Hkv, b, D) (advanced indices first)
        key_blocks = F.pad(k, (0, 0, 0, pad)).view(batch, n_kv_heads, n, b, d_k)
        key_blocks = key_blocks[rows_of, :, index].transpose(2, 3)  # (B, n, Hkv, K, b, Dk)
        value_blocks = F.pad(v, (0, 0, 0, pad)).view(batch, n_kv_heads, n, b, d_v)
        value_blocks = value_blocks[rows_of, :, index].transpose(2, 3)  # (B, n, Hkv, K, b, Dv)
        allowed = F.pad(key_mask, (0, pad)).view(batch, n, b)[rows_of, index]  # (B, n, K, b)
        allowed = allowed & used[..., None]
        rows = F.pad(q, (0, 0, 0, pad)).view(batch, n_heads, n, b, d_k).transpose(1, 2)
        out, weights = attend(
            rows.reshape(batch * n, n_heads, b, d_k),  # (B n, H, b, Dk)
            key_blocks.reshape(batch * n, n_kv_heads, slots * b, d_k),
            value_blocks.reshape(batch * n, n_kv_heads, slots * b, d_v),
            allowed.reshape(batch * n, 1, 1, slots * b),
            dropout_p=dropout_p,
            need_weights=need_weights,
        )  # (B n, H, b, Dv)
        out = out.view(batch, n, n_heads, b, d_v).transpose(1, 2).reshape(batch, n_heads, -1, d_v)

        n_global = min(self.num_global_blocks * b, t_len)
        global_out, global_weights = attend(
            q[:, :, :n_global], k, v, key_mask[:, None, None, :], False, dropout_p, need_weights
        )  # (B, H, g b, Dv): the global queries see every key
        out = torch.cat([global_out, out[:, :, n_global:t_len]], dim=2)  # (B, H, T, Dv)
        if need_weights:
            weights = self._dense_weights(weights, index, batch, n_heads, n, t_len)
            weights = torch.cat([global_weights, weights[:, :, n_global:]], dim=2)
        return out, weights

    def _dense_weights(
        self, weights: Tensor, index: Tensor, batch: int, n_heads: int, n: int, t_len: int
    ) -> Tensor:
        """The blocks' weights, (B n, H, b, K b), placed in a (B, H, T, S) matrix, for
        drawing (the only O(T S) thing here; unused slots hold 0)."""
        b, slots = self.block_size, index.size(-1)
        weights = weights.view(batch, n, n_heads, b, slots, b).permute(0, 2, 1, 3, 4, 5)
        dense = weights.new_zeros(batch, n_heads, n, b, n, b)
        where = index[:, None, :, None, :, None].expand_as(weights)  # index: (B, n, K)
        dense.scatter_add_(4, where, weights)  # (B, H, n, b, n, b)
        return dense.view(batch, n_heads, n * b, n * b)[:, :, :t_len, :t_len]

    @staticmethod
    def _check(
        q: Tensor, k: Tensor, mask: Tensor | None, causal: bool, bias: Tensor | None
    ) -> None:
        if causal:
            raise ValueError(
                "bigbird attention has no causal form (ModelConfig.attention 'bigbird' is for "
                "encoders: architecture encoder_only); for a decoder use sliding_window, "
                "linear or performer"
            )
        if bias is not None:
            raise ValueError("bigbird attention takes no score bias")
        if q.size(-2) != k.size(-2):
            raise ValueError(
                f"bigbird attention is self-attention over one sequence: T={q.size(-2)} "
                f"queries but S={k.size(-2)} keys"
            )
        if mask is not None and (mask.dim() != 4 or mask.size(-2) != 1 or mask.size(1) != 1):
            raise ValueError(
                f"bigbird attention takes a key mask (B, 1, 1, S), got {tuple(mask.shape)}"
            )
