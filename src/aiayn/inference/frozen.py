"""Inference as one explicit transform: `freeze(model)` returns a fast copy of a trained model.

    fast = freeze(model)                       # or freeze(model, dtype=torch.bfloat16)
    fast8 = freeze(model, torch.int8)          # int8 weights, on the CPU (below)
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

`freeze(model, torch.int8)` is CPU inference with int8 weights (`Int8Linear`): each
product's weight is quantized once, symmetrically per output channel, and its
activations are quantized per token at run time (dynamic quantization, on
PyTorch's int8 kernels, `INT8_ENGINE`: VNNI where the CPU has it, AMX through
oneDNN). A product too small for int8 to gain (`INT8_MIN_ELEMENTS`) stays float32,
and so do embeddings, layer norms and the attention arithmetic. The output
projection stays float32 unless `int8_output=True`: it decides among the
candidates, and rounding there changes more outputs
(docs/explanation/results/cpu-inference.md measures each choice). Every product in
int8, as CTranslate2's int8 runs (issue 44): `freeze(model, torch.int8,
int8_output=True, int8_min_elements=0)`.

Two shapes freeze: the encoder-decoder (`FrozenTransformer`) and the decoder-only
language model (`FrozenDecoderOnly`: the same frozen self-attention and
feed-forward blocks, and its prompt's pass projects only the last position).

Shape legend: B batch, G rows sharing a source row, T query length, S source
length, D d_model, H heads, Hkv key/value heads, Dk / Dv head sizes.
"""

from __future__ import annotations

import copy
import ctypes
import sys

import torch
from torch import Tensor, nn

from aiayn.config import Activation
from aiayn.inference.decoding import DecoderOnlyDecoding

# The products moved to frozen_products; their names still import from here.
from aiayn.inference.frozen_products import _FAST_DTYPES as _FAST_DTYPES
from aiayn.inference.frozen_products import _FLOAT as _FLOAT
from aiayn.inference.frozen_products import _ONEDNN as _ONEDNN
from aiayn.inference.frozen_products import INT8_ENGINE as INT8_ENGINE
from aiayn.inference.frozen_products import PACK_MIN_ELEMENTS as PACK_MIN_ELEMENTS
from aiayn.inference.frozen_products import FrozenLinear as FrozenLinear
from aiayn.inference.frozen_products import Int8Linear as Int8Linear
from aiayn.inference.frozen_products import _Linears as _Linears
from aiayn.inference.frozen_products import int8_engine as int8_engine
from aiayn.inference.frozen_products import int8_product as int8_product
from aiayn.inference.kv_cache import LayerKV
from aiayn.io.int8_weights import (
    weight_products,
)
from aiayn.models import add_to_shape, spec_of
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import Transformer
from aiayn.nn.attention import MultiHeadAttention, merge_heads, split_heads
from aiayn.nn.kernels import DecodingStore
from aiayn.nn.layers import FeedForward
from aiayn.nn.masks import key_mask
from aiayn.nn.positions import PositionScheme


class FrozenFeedForward(nn.Module):
    """`FeedForward` with its ReLU fused into the first product.

    `linears` builds the products (float by default; see `freeze`).
    """

    def __init__(self, ffn: FeedForward, linears: _Linears = _FLOAT) -> None:
        super().__init__()
        fused = ffn.activation_kind is Activation.RELU
        self.linear1 = linears.stacked([ffn.linear1], relu=fused)
        self.activation = None if fused else ffn.activation
        self.linear2 = linears.stacked([ffn.linear2])

    def forward(self, x: Tensor) -> Tensor:
        h = self.linear1(x)  # (B, L, F)
        return self.linear2(h if self.activation is None else self.activation(h))


class FrozenSelfAttention(nn.Module):
    """Self-attention with W^Q, W^K, W^V stacked: one product gives Q, K and V.

    `linears` builds the products (float by default; see `freeze`).
    """

    def __init__(self, mha: MultiHeadAttention, linears: _Linears = _FLOAT) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = mha.n_heads, mha.n_kv_heads
        self.sizes = [mha.n_heads * mha.d_k, mha.n_kv_heads * mha.d_k, mha.n_kv_heads * mha.d_v]
        self.kernel, self.kv_of_head = mha.kernel, mha.kv_of_head
        self.qkv_proj = linears.stacked([mha.q_proj, mha.k_proj, mha.v_proj])
        self.out_proj = _output_projection(mha, linears)

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
        """As `MultiHeadAttention.forward` for self-attention (`source` is `query`)."""
        offset = 0 if cache is None else cache.length
        q, k, v = self.qkv_proj(query).split(self.sizes, dim=-1)
        q = split_heads(q, self.n_heads)  # (B, H, T, Dk)
        k = split_heads(k, self.n_kv_heads)  # (B, Hkv, T, Dk)
        v = split_heads(v, self.n_kv_heads)  # (B, Hkv, T, Dv)
        if rotary is not None:
            q, k = rotary.rotate(q, offset), rotary.rotate(k, offset)
        out, weights = self.kernel.attend_projected(
            q, k, v, cache, mask, causal, 0.0, need_weights, bias, self.kv_of_head
        )
        return self.out_proj(merge_heads(out)), weights


class FrozenCrossAttention(nn.Module):
    """Encoder-decoder attention with W^K, W^V stacked, shared by a sentence's beams.

    When the cache's static store has `group` G > 1, each stored source row serves
    G consecutive query rows (beam search's hypotheses of one sentence): the keys
    and values are computed once per sentence, and the G rows' queries attend them
    as G times more queries of one row (the same result, one product per sentence).
    `linears` builds the products (float by default; see `freeze`).
    """

    def __init__(self, mha: MultiHeadAttention, linears: _Linears = _FLOAT) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = mha.n_heads, mha.n_kv_heads
        self.sizes = [mha.n_kv_heads * mha.d_k, mha.n_kv_heads * mha.d_v]
        self.kernel, self.kv_of_head = mha.kernel, mha.kv_of_head
        self.q_proj = linears.stacked([mha.q_proj])
        self.kv_proj = linears.stacked([mha.k_proj, mha.v_proj])
        self.out_proj = _output_projection(mha, linears)

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
        out, weights = self.kernel.attend_projected(
            q, k, v, None, mask, False, 0.0, need_weights, None, self.kv_of_head
        )
        if group > 1:  # (B/G, H, G T, X) -> (B, H, T, X)
            out = _unfold(out, group, t_len)
            weights = None if weights is None else _unfold(weights, group, t_len)
        return self.out_proj(merge_heads(out)), weights


def _output_projection(
    mha: MultiHeadAttention, linears: _Linears = _FLOAT
) -> FrozenLinear | Int8Linear:
    """W^O, with each head's columns scaled by the module's `head_mask` if it has one."""
    weight = mha.out_proj.weight
    if mha.head_mask is not None and mha.head_mask.dim() != 1:
        raise ValueError(
            f"freeze takes a head mask per head, (H,), not {tuple(mha.head_mask.shape)}"
        )
    if mha.head_mask is not None:  # (D, H Dv): head h owns columns h Dv .. (h + 1) Dv - 1
        scale = mha.head_mask.detach().to(weight.dtype).repeat_interleave(mha.d_v)
        weight = weight * scale
    return linears(weight, mha.out_proj.bias)


def _unfold(x: Tensor, group: int, t_len: int) -> Tensor:
    """(B/G, H, G T, X) -> (B, H, T, X): each source row's G query rows back in place."""
    rows, heads = x.size(0), x.size(1)
    x = x.view(rows, heads, group, t_len, -1).transpose(1, 2)
    return x.reshape(rows * group, heads, t_len, -1)


class FrozenTransformer(Transformer):
    """A `Transformer` frozen for inference by `freeze`: same outputs, faster, no parameters.

    It decodes exactly as the model it was made from (`encode`, `decode`; the search's
    state is `aiayn.inference.decoding.EncoderDecoderDecoding`); `shares_source_rows`
    makes the search's beams share each sentence's encoder output. See `freeze` for
    the arguments.
    """

    shares_source_rows = True

    def __init__(
        self,
        model: Transformer,
        dtype: torch.dtype | None = None,
        int8_output: bool = False,
        int8_per_token: bool = True,
        int8_min_elements: int | None = None,
    ) -> None:
        nn.Module.__init__(self)
        self.cfg = model.cfg
        copied, linears = _inference_copy(
            model, dtype, int8_output, int8_per_token, int8_min_elements
        )
        self.encoder = _frozen_stack(copied.encoder, linears)
        self.decoder = _frozen_stack(copied.decoder, linears)
        self.output = linears.output(copied.output_weight(), copied.output_bias)
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
    """A `DecoderOnly` frozen for inference by `freeze`: same outputs, faster, no parameters.

    See `freeze` for the arguments.
    """

    def __init__(
        self,
        model: DecoderOnly,
        dtype: torch.dtype | None = None,
        int8_output: bool = False,
        int8_per_token: bool = True,
        int8_min_elements: int | None = None,
    ) -> None:
        nn.Module.__init__(self)
        self.cfg = model.cfg
        copied, linears = _inference_copy(
            model, dtype, int8_output, int8_per_token, int8_min_elements
        )
        self.decoder = _frozen_stack(copied.decoder, linears)
        self.output = linears.output(copied.output_weight(), copied.output_bias)
        self.output_proj = self.output_bias = None
        self.eval()

    def project(self, hidden: Tensor) -> Tensor:
        return self.output(hidden)  # (B, T, V)

    def start(self, prompt: Tensor, beam: int = 1) -> DecoderOnlyDecoding:
        """A `DecoderOnlyDecoding` whose prompt's pass projects its last position only
        (the (T - 1) x V products no search reads are skipped)."""
        return DecoderOnlyDecoding(self, prompt, beam, last_position_only=True)

    def reset_parameters(self) -> None:
        raise TypeError("a frozen model has no parameters to initialise")


add_to_shape("encoder_decoder", frozen=FrozenTransformer)
add_to_shape("decoder_only", frozen=FrozenDecoderOnly)


def _inference_copy(
    model: nn.Module,
    dtype: torch.dtype | None,
    int8_output: bool = False,
    int8_per_token: bool = True,
    int8_min_elements: int | None = None,
) -> tuple[nn.Module, _Linears]:
    """A deep copy of `model` without gradients, in eval mode, cast to `dtype` if given
    (float32 for int8), and the builder of its products."""
    int8 = dtype == torch.int8
    if int8:
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(
                f"int8 runs on the CPU (fbgemm/oneDNN kernels); the model is on {device}: "
                "move it to the CPU first, or use bfloat16 there"
            )
        dtype = torch.float32
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"freeze takes a floating-point dtype or torch.int8, not {dtype}")
    casts = dtype is not None and any(p.dtype != dtype for p in model.parameters())
    # The products' weights are re-laid out (or quantized) by the frozen blocks, which
    # replace the copied ones: the copy shares them rather than copying them twice.
    # Not when casting: `.to` would then cast the shared tensors in the model itself.
    shared = [] if casts else _replaced_weights(model)
    copied = copy.deepcopy(model, {id(t): t for t in shared}).eval()
    for p in set(copied.parameters()) - set(shared):  # the model's own stay as they are
        p.requires_grad_(False)
    copied = copied.to(dtype) if casts else copied
    return copied, _Linears(int8, int8_output, int8_per_token, int8_min_elements)


def _replaced_weights(model: nn.Module) -> list[Tensor]:
    """The weights and biases that `freeze` re-lays out into its own products: those of
    the attention and feed-forward blocks of each layer and the untied output matrix."""
    linears = [getattr(model, "output_proj", None)]
    linears += [linear for product in weight_products(model) for linear in product]
    return [t for m in linears if isinstance(m, nn.Linear) for t in m.parameters()]


def _frozen_stack(stack: nn.Module, linears: _Linears) -> nn.Module:
    """`stack` (an encoder or decoder of an inference copy) with its layers frozen in place,
    its products built by `linears`."""
    for layer in stack.layers:
        _freeze_layer(layer, linears)
    return stack


def _freeze_layer(layer: nn.Module, linears: _Linears) -> None:
    """Replace a layer's attention and feed-forward blocks by their frozen forms, in place."""
    if isinstance(getattr(layer, "self_attn", None), MultiHeadAttention):
        layer.self_attn = FrozenSelfAttention(layer.self_attn, linears)
    if isinstance(getattr(layer, "cross_attn", None), MultiHeadAttention):
        layer.cross_attn = FrozenCrossAttention(layer.cross_attn, linears)
    if isinstance(getattr(layer, "feed_forward", None), FeedForward):
        layer.feed_forward = FrozenFeedForward(layer.feed_forward, linears)


def freeze(
    model: Transformer | DecoderOnly,
    dtype: torch.dtype | None = None,
    int8_output: bool = False,
    int8_per_token: bool = True,
    int8_min_elements: int | None = None,
) -> FrozenTransformer | FrozenDecoderOnly:
    """A fast inference copy of `model` (see the module), in `dtype` if given.

    Args:
        model: a trained `Transformer` or `DecoderOnly`, on the device it will run on.
        dtype: the frozen weights' floating-point type (e.g. torch.bfloat16), or
            torch.int8: int8 products (`Int8Linear`) on the CPU, float32 elsewhere;
            unchanged by default.
        int8_output: with torch.int8, quantize the output projection too (by
            default it stays float32: see the module).
        int8_per_token: with torch.int8, quantize the activations with one scale
            per row (token), as `Int8Linear` describes; False: one per product
            (faster, further from float32).
        int8_min_elements: with torch.int8, the fewest weights a product has to be
            quantized (smaller ones stay float32); None: `INT8_MIN_ELEMENTS`
            (`aiayn.io.int8_weights`), 0: every product.

    Returns:
        A `FrozenTransformer` or `FrozenDecoderOnly` in eval mode; `model` itself is
        not changed.

    Raises:
        TypeError: a model whose class is no registered shape (a subclass is not its
            parent), or a shape without a frozen form; the message names it.
        ValueError: torch.int8 for a model not on the CPU, or a dtype that is
            neither floating-point nor torch.int8.
        RuntimeError: torch.int8 where PyTorch has no int8 CPU engine.
    """
    spec = spec_of(model)  # the model's own shape, never a parent class's
    frozen_form = spec.frozen
    if frozen_form is None:
        raise TypeError(
            f"architecture {spec.name} ({type(model).__name__}) has no frozen form to freeze into"
        )
    frozen = frozen_form(
        model, dtype, int8_output, int8_per_token, int8_min_elements=int8_min_elements
    )
    _return_freed_memory()
    return frozen


def _return_freed_memory() -> None:
    """Give the memory freed while freezing back to the operating system (glibc only).

    Freezing allocates and frees a working copy of the model. glibc keeps freed
    blocks of this size in its heap for reuse (it raises its mmap threshold once a
    large block has been freed), so without `malloc_trim` a process that froze a
    model stays larger by about the working copy (`benchmarks/bench_memory.py`).
    """
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return
    trim(0)
