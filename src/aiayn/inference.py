"""Inference as one explicit transform: `freeze(model)` returns a fast copy of a trained model.

    fast = freeze(model)                       # or freeze(model, dtype=torch.bfloat16)
    hypotheses = beam_search(fast, src)        # same outputs as beam_search(model, src)

Like CTranslate2's convert step and PyTorch's freezing, it trades the training
model's flexibility for speed, once, and leaves the training model untouched:

- every weight is copied (and cast to `dtype`): the frozen model holds no link back
  to the training parameters, so an optimizer step can never leave it stale, and
  it has no parameters to train;
- self-attention's W^Q, W^K, W^V become one stacked matrix (one product instead of
  three), and encoder-decoder attention's W^K, W^V another;
- the feed-forward network's ReLU is fused into its first product where oneDNN runs it;
- beam search's K hypotheses of a sentence share that sentence's encoder-decoder
  keys and values (computed once, not K times; the K rows' queries attend them as
  one group);
- on the CPU, products take the layout their fastest kernel wants (`FrozenLinear`);
- the source mask is dropped when no source position is padding (SDPA's unmasked
  kernel then runs).

The frozen model is built for the device the model is on: freeze after moving.
Blocks are recognised by their attribute names: a layer's `self_attn`,
`cross_attn` (a `MultiHeadAttention`) and `feed_forward` (a `FeedForward`).

Two shapes freeze: the encoder-decoder (`FrozenTransformer`) and the decoder-only
language model (`FrozenDecoderOnly`: the same frozen self-attention and
feed-forward blocks, and its prompt's pass projects only the last position).

Shape legend: B batch, G rows sharing a source row, T query length, S source
length, D d_model, H heads, Hkv key/value heads, Dk / Dv head sizes.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.attention import (
    LayerKV,
    MultiHeadAttention,
    attend,
    expand_kv,
    merge_heads,
    split_heads,
)
from aiayn.config import Activation
from aiayn.decoder_only import DecoderOnly, DecoderOnlyDecoding
from aiayn.layers import FeedForward
from aiayn.masks import key_mask
from aiayn.model import Transformer
from aiayn.positions import PositionScheme

PACK_MIN_ELEMENTS = 1 << 18  # weights from this size (512 x 512) may be packed by oneDNN...
PACK_MIN_ROWS = 16  # ...when multiplied by this many rows or more
_FAST_DTYPES = (torch.float32, torch.bfloat16)
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class FrozenLinear(nn.Module):
    """y = x W^T + b (then ReLU, if `relu`) with W laid out for the fastest CPU kernel.

    On the CPU in float32 or bfloat16 the weight is stored transposed, (in, out)
    contiguous, for MKL's sgemm; a large weight (at least `PACK_MIN_ELEMENTS`: the
    output projection, the FFN of the base model) is also packed by oneDNN into its
    blocked layout (`torch.ops.mkldnn`, the primitive `torch.compile` uses for
    frozen linear layers), used for products of at least `PACK_MIN_ROWS` rows, with
    the bias and ReLU applied inside the kernel. A general matrix product re-packs W
    at every call, which for the few-row products of incremental decoding costs as
    much as the multiplication; oneDNN's fixed cost per call (~15 us) exceeds what
    packing saves for small weights and few rows (README, "Speed"). In bfloat16 every
    weight is packed and every product runs in oneDNN: its bfloat16 kernels beat the
    general product at all sizes and row counts, one row included (the bf16 rows of
    benchmarks/bench_generate.py). Elsewhere (other devices and dtypes) it is `F.linear`.

    Args:
        weight: (out, in); copied.
        bias: (out,) or None; copied.
        relu: apply ReLU to the output.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, relu: bool = False) -> None:
        super().__init__()
        weight = weight.detach().clone()
        self.out_features, self.in_features = weight.shape
        self.relu = relu
        self.bias = None if bias is None else bias.detach().clone()
        self.cpu_fast = weight.device.type == "cpu" and weight.dtype in _FAST_DTYPES
        self.weight = None if self.cpu_fast else weight
        self.weight_t = weight.t().contiguous() if self.cpu_fast else None
        self.always_packed = weight.dtype == torch.bfloat16  # see the class docstring
        packs = weight.numel() >= PACK_MIN_ELEMENTS or self.always_packed
        self.packed = _onednn_pack(weight) if self.cpu_fast and packs and _ONEDNN else None

    def forward(self, x: Tensor) -> Tensor:
        if not self.cpu_fast or x.dtype != self.weight_t.dtype:
            weight = self.weight if self.weight is not None else self.weight_t.t()
            out = F.linear(x, weight, self.bias)
            return F.relu(out) if self.relu else out
        rows_enough = self.always_packed or math.prod(x.shape[:-1]) >= PACK_MIN_ROWS
        if self.packed is not None and rows_enough:
            attr = "relu" if self.relu else "none"
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, attr, [], "")
        rows = x.reshape(-1, self.in_features)
        out = (
            rows @ self.weight_t
            if self.bias is None
            else torch.addmm(self.bias, rows, self.weight_t)
        )
        out = out.view(*x.shape[:-1], self.out_features)
        return out.relu_() if self.relu else out

    def extra_repr(self) -> str:
        packed = ", packed" if self.packed is not None else ""
        return f"in={self.in_features}, out={self.out_features}, relu={self.relu}{packed}"


def _onednn_pack(weight: Tensor) -> Tensor | None:
    """W in oneDNN's blocked layout, or None where oneDNN cannot run this dtype here
    (bfloat16 needs AVX512-BW/VL/DQ or AVX-NE-CONVERT)."""
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
    except RuntimeError:
        return None


def _stacked(linears: list[nn.Linear], relu: bool = False) -> FrozenLinear:
    """One `FrozenLinear` for several maps of the same input, stacked along their outputs."""
    weight = torch.cat([linear.weight for linear in linears])
    biases = [linear.bias for linear in linears]
    bias = None if any(b is None for b in biases) else torch.cat(biases)
    return FrozenLinear(weight, bias, relu)


class FrozenFeedForward(nn.Module):
    """`FeedForward` with its ReLU fused into the first product."""

    def __init__(self, ffn: FeedForward) -> None:
        super().__init__()
        fused = ffn.activation_kind is Activation.RELU
        self.linear1 = _stacked([ffn.linear1], relu=fused)
        self.activation = None if fused else ffn.activation
        self.linear2 = _stacked([ffn.linear2])

    def forward(self, x: Tensor) -> Tensor:
        h = self.linear1(x)  # (B, L, F)
        return self.linear2(h if self.activation is None else self.activation(h))


class FrozenSelfAttention(nn.Module):
    """Self-attention with W^Q, W^K, W^V stacked: one product gives Q, K and V."""

    def __init__(self, mha: MultiHeadAttention) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = mha.n_heads, mha.n_kv_heads
        self.sizes = [mha.n_heads * mha.d_k, mha.n_kv_heads * mha.d_k, mha.n_kv_heads * mha.d_v]
        self.kernel, self.kv_of_head = mha.kernel, mha.kv_of_head
        self.qkv_proj = _stacked([mha.q_proj, mha.k_proj, mha.v_proj])
        self.out_proj = _output_projection(mha)

    def forward(
        self,
        query: Tensor,
        source: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: LayerKV | None = None,
        need_weights: bool = False,
        rotary: PositionScheme | None = None,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """As `MultiHeadAttention.forward` for self-attention (`source` is `query`)."""
        offset = 0 if cache is None else cache.length
        q, k, v = self.qkv_proj(query).split(self.sizes, dim=-1)
        q = split_heads(q, self.n_heads)  # (B, H, T, Dk)
        k = split_heads(k, self.n_kv_heads)  # (B, Hkv, T, Dk)
        v = split_heads(v, self.n_kv_heads)  # (B, Hkv, T, Dv)
        if rotary is not None:
            q, k = rotary.rotate(q, offset), rotary.rotate(k, offset)
        if cache is not None:
            k, v = cache.append(k, v)
        k, v = expand_kv(k, v, self.kv_of_head)
        out, weights = self.kernel(q, k, v, mask, causal, 0.0, need_weights, bias)
        return self.out_proj(merge_heads(out)), weights


class FrozenCrossAttention(nn.Module):
    """Encoder-decoder attention with W^K, W^V stacked, shared by a sentence's beams.

    When the cache's static store has `group` G > 1, each stored source row serves
    G consecutive query rows (beam search's hypotheses of one sentence): the keys
    and values are computed once per sentence, and the G rows' queries attend them
    as G times more queries of one row (the same result, one product per sentence).
    """

    def __init__(self, mha: MultiHeadAttention) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = mha.n_heads, mha.n_kv_heads
        self.sizes = [mha.n_kv_heads * mha.d_k, mha.n_kv_heads * mha.d_v]
        self.kv_of_head = mha.kv_of_head
        self.q_proj = _stacked([mha.q_proj])
        self.kv_proj = _stacked([mha.k_proj, mha.v_proj])
        self.out_proj = _output_projection(mha)

    def forward(
        self,
        query: Tensor,
        source: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: LayerKV | None = None,
        need_weights: bool = False,
        rotary: PositionScheme | None = None,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """As `MultiHeadAttention.forward` for encoder-decoder attention.

        `source` and `mask` have one row per sentence: B / G rows, with G the
        cache's `group` (1 without a cache).
        """
        batch, t_len, _ = query.shape
        q = split_heads(self.q_proj(query), self.n_heads)  # (B, H, T, Dk)
        if cache is not None and cache.key is not None:
            k, v = cache.key, cache.value
        else:
            k, v = self.kv_proj(source).split(self.sizes, dim=-1)
            k = split_heads(k, self.n_kv_heads)  # (B/G, Hkv, S, Dk)
            v = split_heads(v, self.n_kv_heads)  # (B/G, Hkv, S, Dv)
            if cache is not None:
                cache.key, cache.value = k, v
        group = 1 if cache is None else cache.group
        rows = k.size(0)
        if rows * group != batch:
            raise ValueError(
                f"{batch} query rows cannot share {rows} source rows in groups of {group}"
            )
        if group > 1:  # (B, H, T, Dk) -> (B/G, H, G T, Dk)
            q = q.view(rows, group, self.n_heads, t_len, -1).transpose(1, 2)
            q = q.reshape(rows, self.n_heads, group * t_len, -1)
        k, v = expand_kv(k, v, self.kv_of_head)
        out, weights = attend(q, k, v, mask, False, 0.0, need_weights)
        if group > 1:  # (B/G, H, G T, X) -> (B, H, T, X)
            out = _unfold(out, group, t_len)
            weights = None if weights is None else _unfold(weights, group, t_len)
        return self.out_proj(merge_heads(out)), weights


def _output_projection(mha: MultiHeadAttention) -> FrozenLinear:
    """W^O, with each head's columns scaled by the module's `head_mask` if it has one."""
    weight = mha.out_proj.weight
    if mha.head_mask is not None and mha.head_mask.dim() != 1:
        raise ValueError(
            f"freeze takes a head mask per head, (H,), not {tuple(mha.head_mask.shape)}"
        )
    if mha.head_mask is not None:  # (D, H Dv): head h owns columns h Dv .. (h + 1) Dv - 1
        scale = mha.head_mask.detach().to(weight.dtype).repeat_interleave(mha.d_v)
        weight = weight * scale
    return FrozenLinear(weight, mha.out_proj.bias)


def _unfold(x: Tensor, group: int, t_len: int) -> Tensor:
    """(B/G, H, G T, X) -> (B, H, T, X): each source row's G query rows back in place."""
    rows, heads = x.size(0), x.size(1)
    x = x.view(rows, heads, group, t_len, -1).transpose(1, 2)
    return x.reshape(rows * group, heads, t_len, -1)


class FrozenTransformer(Transformer):
    """A `Transformer` frozen for inference by `freeze`: same outputs, faster, no parameters.

    It decodes exactly as the model it was made from (`encode`, `decode`,
    `start` for the search); `shares_source_rows` makes the search's beams share
    each sentence's encoder output.
    """

    shares_source_rows = True

    def __init__(self, model: Transformer, dtype: torch.dtype | None = None) -> None:
        nn.Module.__init__(self)
        self.cfg = model.cfg
        copied = _inference_copy(model, dtype)
        self.encoder, self.decoder = _frozen_stack(copied.encoder), _frozen_stack(copied.decoder)
        self.output = FrozenLinear(copied.output_weight(), copied.output_bias)
        self.output_proj = self.output_bias = None
        self.eval()

    def project(self, hidden: Tensor) -> Tensor:
        return self.output(hidden)  # (B, T, V)

    def source_mask(self, real_tokens: Tensor) -> Tensor | None:
        """None when no source position is padding (checked on the CPU only).

        Without a mask attention takes SDPA's unmasked kernel and skips its guard
        for fully padded rows: a batch of equal-length sentences (as after length
        bucketing) decodes faster. On an accelerator reading the mask would wait
        for the device, so the mask stays.
        """
        if real_tokens.device.type == "cpu" and bool(real_tokens.all()):
            return None
        return key_mask(real_tokens)

    def reset_parameters(self) -> None:
        raise TypeError("a frozen model has no parameters to initialise")


class FrozenDecoderOnly(DecoderOnly):
    """A `DecoderOnly` frozen for inference by `freeze`: same outputs, faster, no parameters."""

    def __init__(self, model: DecoderOnly, dtype: torch.dtype | None = None) -> None:
        nn.Module.__init__(self)
        self.cfg = model.cfg
        copied = _inference_copy(model, dtype)
        self.decoder = _frozen_stack(copied.decoder)
        self.output = FrozenLinear(copied.output_weight(), copied.output_bias)
        self.output_proj = self.output_bias = None
        self.eval()

    def project(self, hidden: Tensor) -> Tensor:
        return self.output(hidden)  # (B, T, V)

    def start(self, prompt: Tensor, beam: int = 1) -> DecoderOnlyDecoding:
        """As `DecoderOnly.start`; the prompt's pass projects its last position only."""
        return DecoderOnlyDecoding(_LastPosition(self), prompt, beam)

    def reset_parameters(self) -> None:
        raise TypeError("a frozen model has no parameters to initialise")


class _LastPosition:
    """A decoder-only model seen through the logits of its last position only: the
    prompt's pass then skips the (T - 1) x V products no search reads."""

    def __init__(self, model: DecoderOnly) -> None:
        self.model, self.cfg = model, model.cfg

    def new_cache(self):
        return self.model.new_cache()

    def __call__(self, ids: Tensor, cache=None) -> Tensor:
        return self.model.project(self.model.hidden(ids, cache)[:, -1:])  # (B, 1, V)


def _inference_copy(model: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """A deep copy of `model` without gradients, in eval mode, cast to `dtype` if given."""
    copied = copy.deepcopy(model).requires_grad_(False).eval()
    return copied if dtype is None else copied.to(dtype)


def _frozen_stack(stack: nn.Module) -> nn.Module:
    """`stack` (an encoder or decoder of an inference copy) with its layers frozen in place."""
    for layer in stack.layers:
        _freeze_layer(layer)
    return stack


def _freeze_layer(layer: nn.Module) -> None:
    """Replace a layer's attention and feed-forward blocks by their frozen forms, in place."""
    if isinstance(getattr(layer, "self_attn", None), MultiHeadAttention):
        layer.self_attn = FrozenSelfAttention(layer.self_attn)
    if isinstance(getattr(layer, "cross_attn", None), MultiHeadAttention):
        layer.cross_attn = FrozenCrossAttention(layer.cross_attn)
    if isinstance(getattr(layer, "feed_forward", None), FeedForward):
        layer.feed_forward = FrozenFeedForward(layer.feed_forward)


def freeze(
    model: Transformer | DecoderOnly, dtype: torch.dtype | None = None
) -> FrozenTransformer | FrozenDecoderOnly:
    """A fast inference copy of `model` (see the module), in `dtype` if given.

    Args:
        model: a trained `Transformer` or `DecoderOnly`, on the device it will run on.
        dtype: the frozen weights' floating-point type (e.g. torch.bfloat16);
            unchanged by default.

    Returns:
        A `FrozenTransformer` or `FrozenDecoderOnly` in eval mode; `model` itself is
        not changed.

    Raises:
        TypeError: a model of another shape.
    """
    if isinstance(model, DecoderOnly):
        return FrozenDecoderOnly(model, dtype)
    if isinstance(model, Transformer):
        return FrozenTransformer(model, dtype)
    raise TypeError(f"freeze takes a Transformer or a DecoderOnly, not a {type(model).__name__}")
