"""Scaled dot-product attention (section 3.2.1) and multi-head attention (3.2.2).

Shape legend:
    B batch, T query length, S key/value length,
    H query heads, Hkv key/value heads (H is a multiple of Hkv),
    D d_model, Dk query/key head size, Dv value head size.

`MultiHeadAttention` owns the projections W^Q, W^K, W^V and W^O; the attention
math between them is its kernel, chosen once when the module is built: SDPA
(`aiayn.nn.kernels.sdpa.attend`) by default, or any registered kernel
(`aiayn.nn.kernels`: the explicit path that always has the weights, a sliding
window, linear attention, ...). During incremental decoding the kernel attends from
a store of the past that decoding hands it (`aiayn.inference.kv_cache`: past keys and
values, or the kernel's own recurrent state); this module only duck-types it
(`aiayn.nn.kernels.DecodingStore`). Masks are bool with True = may
attend (see `aiayn.nn.masks`); position biases (relative, ALiBi) are float and added
to the scores. This module is the training model, as literal as the paper; fast
inference is `aiayn.inference.frozen.freeze`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import Tensor, nn

from aiayn.nn.hooks import HookPoint, hooked
from aiayn.nn.kernels import DecodingStore, FunctionKernel, Kernel, expand_kv
from aiayn.nn.kernels.sdpa import SdpaKernel, attend

if TYPE_CHECKING:
    from aiayn.nn.positions import PositionScheme


AttentionFunction = Callable[..., tuple[Tensor, Tensor | None]]
"""kernel(q, k, v, mask, causal, dropout_p, need_weights, bias) -> (out, weights or None):
`attend`, or an `aiayn.nn.kernels.Kernel`."""

__all__ = [  # attend and expand_kv are re-exported from where they live
    "AttentionFunction", "MultiHeadAttention", "attend", "expand_kv", "merge_heads",
    "regular_groups", "split_heads",
]  # fmt: skip


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(B, L, heads x size) -> (B, heads, L, size)."""
    batch, length, _ = x.shape
    return x.view(batch, length, n_heads, -1).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, heads, L, size) -> (B, L, heads x size): Concat(head_1, ..., head_h)."""
    batch, heads, length, size = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * size)


def regular_groups(n_heads: int, n_kv_heads: int) -> tuple[int, ...]:
    """For each of `n_heads` query heads, its key/value head: H / Hkv consecutive per group."""
    return tuple(h // (n_heads // n_kv_heads) for h in range(n_heads))


def _irregular_groups(
    n_heads: int, n_kv_heads: int, kv_of_head: tuple[int, ...] | None
) -> tuple[int, ...] | None:
    """`kv_of_head` checked, as a tuple, or None when it is the regular grouping."""
    regular = n_heads % n_kv_heads == 0
    if kv_of_head is None:
        if not regular:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
        return None
    kv_of_head = tuple(int(i) for i in kv_of_head)
    if len(kv_of_head) != n_heads or set(kv_of_head) != set(range(n_kv_heads)):
        raise ValueError(
            f"kv_of_head {kv_of_head} must name a key/value head in [0, {n_kv_heads}) for each "
            f"of the {n_heads} query heads, and use every key/value head"
        )
    if regular and kv_of_head == regular_groups(n_heads, n_kv_heads):
        return None
    return kv_of_head


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O (section 3.2.2).

    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V). The same module serves encoder
    self-attention, causal decoder self-attention and encoder-decoder attention.
    With `n_kv_heads < n_heads`, groups of query heads share key/value heads
    (grouped-query attention; `n_kv_heads=1` is multi-query attention).

        mha = MultiHeadAttention(d_model=512, n_heads=8)
        out, weights = mha(x, x, need_weights=True)     # weights: (B, 8, T, T)

    Args:
        d_model: input and output width D.
        n_heads: query heads H.
        n_kv_heads: key/value heads Hkv (default `n_heads`); `n_heads` must be a
            multiple of it.
        d_k: query/key head size Dk (default `d_model // n_heads`).
        d_v: value head size Dv (default `d_model // n_heads`).
        dropout: dropout on attention weights.
        bias: biases on the four projections (the paper's affine maps have them).
        kernel: how the attention itself is computed: a `aiayn.nn.kernels.Kernel`
            (`build_kernel`; default SDPA), or a function of `attend`'s signature.
        kv_of_head: for each query head, the key/value head it reads, when that is
            not the regular grouping (H / Hkv consecutive query heads per key/value
            head): what is left after pruning heads of grouped-query attention
            (`aiayn.analysis.pruning`). Every key/value head must be read by some query head.

    Attributes:
        head_mask: None, or an (H,) tensor (or (B, H): one row per sentence) each
            head's output is multiplied by before W^O: 0 silences a head at
            inference (Michel et al. 2019); a tensor of ones that requires grad
            gives each head's importance as the gradient of the loss with respect
            to it. Not saved in checkpoints.

    Raises:
        ValueError: heads that do not divide, or no head size given where d_model
            does not divide by n_heads.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        kernel: Kernel | AttentionFunction | None = None,
        kv_of_head: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.kv_of_head = _irregular_groups(n_heads, n_kv_heads, kv_of_head)
        if (d_k is None or d_v is None) and d_model % n_heads != 0:
            raise ValueError(
                f"d_model ({d_model}) is not divisible by n_heads ({n_heads}); give d_k and d_v"
            )
        d_k = d_model // n_heads if d_k is None else d_k
        d_v = d_model // n_heads if d_v is None else d_v
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_k, self.d_v = d_k, d_v
        self.dropout = dropout
        self.kernel = SdpaKernel() if kernel is None else kernel
        self.head_mask: Tensor | None = None
        self.q_proj = nn.Linear(d_model, n_heads * d_k, bias=bias)  # W^Q of all heads
        self.k_proj = nn.Linear(d_model, n_kv_heads * d_k, bias=bias)  # W^K
        self.v_proj = nn.Linear(d_model, n_kv_heads * d_v, bias=bias)  # W^V
        self.out_proj = nn.Linear(n_heads * d_v, d_model, bias=bias)  # W^O: (h d_v) x d_model
        # where activations can be read or replaced (`aiayn.nn.hooks`)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_weights = HookPoint()  # (B, H, T, S), from the kernel's explicit path
        self.hook_z = HookPoint()  # each head's output before W^O, (B, H, T, Dv)

    @property
    def kernel(self) -> Kernel:
        """The attention math between the projections (`aiayn.nn.kernels.Kernel`)."""
        return self.__dict__["_kernel"]

    @kernel.setter
    def kernel(self, kernel: Kernel | AttentionFunction) -> None:
        # a plain function of `attend`'s signature is wrapped, when built or assigned later
        kernel = kernel if isinstance(kernel, Kernel) else FunctionKernel(kernel)
        # A kernel that is also a module (Performer's features, BigBird's seed) is this
        # module's submodule "kernel": its buffers move and are saved with the model.
        # Kept outside nn.Module's own attribute handling, so that it is registered once.
        if isinstance(kernel, nn.Module):
            self._modules["kernel"] = kernel
        else:
            self._modules.pop("kernel", None)
        self.__dict__["_kernel"] = kernel

    def __setattr__(self, name: str, value: object) -> None:
        if name == "kernel":  # nn.Module would take a module value before the setter ran
            type(self).kernel.fset(self, value)
        else:
            super().__setattr__(name, value)

    def forward(
        self,
        query: Tensor,
        source: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: DecodingStore | None = None,
        need_weights: bool = False,
        rotary: PositionScheme | None = None,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from `query` to `source` (`query` itself by default: self-attention).

        Args:
            query: (B, T, D).
            source: (B, S, D) the keys and values come from; ignored when a static
                `cache` is already filled.
            mask: bool, broadcastable to (B, H, T, S); True = may attend.
            causal: causal self-attention (the decoder's).
            cache: this sub-layer's store for incremental decoding (`DecodingStore`): a
                static `aiayn.inference.kv_cache.LayerKV` (encoder-decoder attention), or
                a growing store of the kind its kernel keeps, which the kernel attends from.
            need_weights: also return the (B, H, T, S) attention weights (they are also
                computed whenever `hook_weights` is listened to).
            rotary: a position scheme that rotates queries and keys (RoPE), applied
                at the cache's offset.
            bias: float (H, T, S) or broadcastable, added to the scores.

        Returns:
            (B, T, D) output and the weights or None.
        """
        source = query if source is None else source
        offset = 0 if cache is None else cache.length
        q = split_heads(self.q_proj(query), self.n_heads)  # (B, H, T, Dk)
        if rotary is not None:
            q = rotary.rotate(q, offset)
        q = hooked(self.hook_q, q)
        if cache is not None and cache.static and cache.key is not None:
            k, v = cache.key, cache.value
        else:
            k = split_heads(self.k_proj(source), self.n_kv_heads)  # (B, Hkv, S, Dk)
            v = split_heads(self.v_proj(source), self.n_kv_heads)  # (B, Hkv, S, Dv)
            if rotary is not None:
                k = rotary.rotate(k, offset)
            k, v = hooked(self.hook_k, k), hooked(self.hook_v, v)
            if cache is not None and cache.static:
                cache.key, cache.value = k, v
        growing = None if cache is None or cache.static else cache  # the kernel keeps its own
        dropout_p = self.dropout if self.training else 0.0
        hook_weights = self.hook_weights.listened()
        out, weights = self.kernel.attend_projected(
            q, k, v, growing, mask, causal, dropout_p, need_weights or hook_weights, bias,
            self.kv_of_head,
        )  # fmt: skip
        if hook_weights and weights is not None:
            hooked_weights = self.hook_weights(weights)
            if hooked_weights is not weights:  # replaced: the output follows the new weights
                if growing is not None:
                    raise ValueError(
                        "attention weights are replaced on a whole-sequence pass, not while "
                        "decoding from a cache (its keys are the kernel's)"
                    )
                _, v = expand_kv(k, v, self.kv_of_head)
                groups = self.n_heads // v.size(1)
                out = hooked_weights.to(v.dtype) @ v.repeat_interleave(groups, dim=1)
            weights = hooked_weights if need_weights else None
        return self._output(out), weights

    def _output(self, out: Tensor) -> Tensor:
        """(B, H, T, Dv) heads -> (B, T, D): each head scaled by `head_mask`, then W^O."""
        out = hooked(self.hook_z, out)
        if self.head_mask is not None:
            out = out * self.head_mask.to(out.dtype)[..., None, None]  # (B, H, T, Dv)
        return self.out_proj(merge_heads(out))  # (B, T, D)
