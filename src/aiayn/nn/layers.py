"""The position-wise feed-forward network and the encoder and decoder layers (section 3.1).

Shape legend: B batch, S source length, T target length, D d_model, F d_ff.

Every sub-layer is wrapped as the paper has it, `LayerNorm(x + Dropout(Sublayer(x)))`
(post-norm), or with `norm_first` as `x + Dropout(Sublayer(LayerNorm(x)))` (pre-norm).
Layers receive their sub-modules ready-made; `aiayn.models.encoder_decoder` builds them from a config.
A layer given no feed-forward network (`feed_forward=None`, a config's `d_ff=0`) is
attention-only: it has no feed-forward sub-layer, residual or norm, and its
`hook_resid_post` equals the stream after its last attention sub-layer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import Activation
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.dropout import Dropout
from aiayn.nn.hooks import HookPoint, hooked

if TYPE_CHECKING:
    from aiayn.nn.kernels import DecodingStore
    from aiayn.nn.positions import PositionScheme

_ACTIVATIONS: dict[Activation, Callable[[Tensor], Tensor]] = {
    Activation.RELU: F.relu,
    Activation.GELU: F.gelu,
    Activation.GELU_TANH: functools.partial(F.gelu, approximate="tanh"),
    Activation.SWISH: F.silu,
}


def activation_function(kind: Activation) -> Callable[[Tensor], Tensor]:
    """The non-linearity `kind` as a function of a tensor."""
    return _ACTIVATIONS[Activation(kind)]


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position alike (section 3.3)."""

    def __init__(self, d_model: int, d_ff: int, activation: Activation = Activation.RELU) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.activation_kind = Activation(activation)
        self.activation = activation_function(self.activation_kind)
        self.hook_hidden = HookPoint()  # (B, L, F): after the non-linearity

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(hooked(self.hook_hidden, self.activation(self.linear1(x))))


class Residual(nn.Module):
    """The residual connection, dropout and layer normalisation around one sub-layer."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def sublayer_input(self, x: Tensor) -> Tensor:
        """What the sub-layer sees: x itself (post-norm) or LayerNorm(x) (pre-norm)."""
        return self.norm(x) if self.norm_first else x

    def forward(self, x: Tensor, sublayer_output: Tensor) -> Tensor:
        """LayerNorm(x + Dropout(out)) (post-norm) or x + Dropout(out) (pre-norm)."""
        x = x + self.dropout(sublayer_output)
        return x if self.norm_first else self.norm(x)


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network, each wrapped in `Residual`.

    With `feed_forward` None the layer is attention-only (no second sub-layer)."""

    def __init__(
        self,
        self_attn: MultiHeadAttention,
        feed_forward: FeedForward | None,
        d_model: int,
        dropout: float,
        norm_first: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.attn_residual = Residual(d_model, dropout, norm_first, eps)
        self.ff_residual = (
            None if feed_forward is None else Residual(d_model, dropout, norm_first, eps)
        )
        # the residual stream entering, between the sub-layers, and leaving (`aiayn.nn.hooks`)
        self.hook_resid_pre, self.hook_resid_mid = HookPoint(), HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        rotary: PositionScheme | None = None,
        bias: Tensor | None = None,
    ) -> Tensor:
        """x: (B, S, D); mask: bool (B, 1, 1, S); rotary, bias: the stack's positions (see
        `MultiHeadAttention`). Returns (B, S, D)."""
        x = hooked(self.hook_resid_pre, x)
        h = self.attn_residual.sublayer_input(x)
        out, _ = self.self_attn(h, h, mask, rotary=rotary, bias=bias)
        x = hooked(self.hook_resid_mid, self.attn_residual(x, out))
        if self.feed_forward is not None:
            x = self.ff_residual(x, self.feed_forward(self.ff_residual.sublayer_input(x)))
        return hooked(self.hook_resid_post, x)


class DecoderLayer(nn.Module):
    """Causal self-attention, encoder-decoder attention, then the feed-forward network.

    The self-attention's pattern is causal unless a `self_mask` says otherwise.

    Without `cross_attn` it is the block of a decoder-only stack (GPT): causal
    self-attention and the feed-forward network. With `feed_forward` None it has no
    feed-forward sub-layer (attention-only).
    """

    def __init__(
        self,
        self_attn: MultiHeadAttention,
        cross_attn: MultiHeadAttention | None,
        feed_forward: FeedForward | None,
        d_model: int,
        dropout: float,
        norm_first: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.feed_forward = feed_forward
        self.self_residual = Residual(d_model, dropout, norm_first, eps)
        self.cross_residual = (
            None if cross_attn is None else Residual(d_model, dropout, norm_first, eps)
        )
        self.ff_residual = (
            None if feed_forward is None else Residual(d_model, dropout, norm_first, eps)
        )
        # the residual stream entering, after self-attention, after encoder-decoder
        # attention (with it) and leaving (`aiayn.nn.hooks`)
        self.hook_resid_pre, self.hook_resid_mid = HookPoint(), HookPoint()
        self.hook_resid_cross = None if cross_attn is None else HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        self_cache: DecodingStore | None = None,
        cross_cache: DecodingStore | None = None,
        rotary: PositionScheme | None = None,
        bias: Tensor | None = None,
        self_mask: Tensor | None = None,
    ) -> Tensor:
        """One decoder layer.

        Args:
            x: (B, T, D) target states (only the new positions when decoding with a cache).
            memory: (B, S, D) encoder output (None without cross-attention).
            memory_mask: bool (B, 1, 1, S), True at real source tokens, or None.
            self_cache, cross_cache: this layer's decoding stores (`aiayn.inference.kv_cache`),
                or None.
            rotary, bias: the stack's positions for self-attention.
            self_mask: the self-attention's pattern as a bool (B, 1, T, L + T) mask,
                True = may attend, instead of the causal one (a prefix LM's
                bidirectional prefix, `aiayn.nn.masks.prefix_mask`); None: causal.

        Returns:
            (B, T, D) states.
        """
        x = hooked(self.hook_resid_pre, x)
        h = self.self_residual.sublayer_input(x)
        causal = self_mask is None
        out, _ = self.self_attn(h, h, self_mask, causal, cache=self_cache, rotary=rotary, bias=bias)
        x = hooked(self.hook_resid_mid, self.self_residual(x, out))
        if self.cross_attn is not None:
            h = self.cross_residual.sublayer_input(x)
            out, _ = self.cross_attn(h, memory, memory_mask, cache=cross_cache)
            x = hooked(self.hook_resid_cross, self.cross_residual(x, out))
        if self.feed_forward is not None:
            x = self.ff_residual(x, self.feed_forward(self.ff_residual.sublayer_input(x)))
        return hooked(self.hook_resid_post, x)
