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

import contextlib
import copy
import ctypes
import sys
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import Activation
from aiayn.inference.decoding import DecoderOnlyDecoding
from aiayn.inference.kv_cache import LayerKV
from aiayn.io import int8_weights
from aiayn.io.int8_weights import (
    int8_scales,
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

PACK_MIN_ELEMENTS = 1 << 18  # weights from this size (512 x 512) are packed by oneDNN
_FAST_DTYPES = (torch.float32, torch.bfloat16)
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class FrozenLinear(nn.Module):
    """y = x W^T + b (then ReLU, if `relu`) with W laid out for the fastest CPU kernel.

    On the CPU in float32 or bfloat16 each weight is held once, in one layout. A large
    weight (at least `PACK_MIN_ELEMENTS`: 512 x 512 and up) is packed by oneDNN into
    its blocked layout (`torch.ops.mkldnn`, the primitive `torch.compile` uses for
    frozen linear layers) and every product runs there, with the bias and ReLU
    applied inside the kernel: a general matrix product re-packs W at every call,
    which for the few-row products of decoding costs more than the multiplication
    (`benchmarks/bench_int8_kernels.py` times both). A smaller weight is stored transposed, (in, out)
    contiguous, for MKL's sgemm: oneDNN's fixed cost per call exceeds what packing
    saves there. In bfloat16 every weight is packed: oneDNN's bfloat16 kernels beat
    the general product at all sizes and row counts (the bf16 rows of
    benchmarks/bench_generate.py). Elsewhere (other devices and dtypes) it is
    `F.linear`.

    Args:
        weight: (out, in); copied.
        bias: (out,) or None; copied.
        relu: apply ReLU to the output.
        keep_transposed: keep the (in, out) copy beside a packed weight too (the
            output projection's: an output shortlist gathers its rows).
    """

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None,
        relu: bool = False,
        keep_transposed: bool = False,
    ) -> None:
        super().__init__()
        weight = weight.detach()
        self.out_features, self.in_features = weight.shape
        self.relu = relu
        self.bias = None if bias is None else bias.detach().clone()
        self.dtype = weight.dtype
        self.cpu_fast = weight.device.type == "cpu" and weight.dtype in _FAST_DTYPES
        packs = weight.numel() >= PACK_MIN_ELEMENTS or weight.dtype == torch.bfloat16
        self.packed = _onednn_pack(weight) if self.cpu_fast and packs and _ONEDNN else None
        transposed = self.cpu_fast and (self.packed is None or keep_transposed)
        self.weight = None if self.cpu_fast else weight.clone()
        # a copy even where W^T is already contiguous (one row or column): no link back
        self.weight_t = (
            weight.t().clone(memory_format=torch.contiguous_format) if transposed else None
        )

    def forward(self, x: Tensor) -> Tensor:
        if not self.cpu_fast or (x.dtype != self.dtype and self.weight_t is not None):
            weight = self.weight if self.weight is not None else self.weight_t.t()
            out = F.linear(x, weight, self.bias)
            return F.relu(out) if self.relu else out
        if self.packed is not None and not self._one_row_transposed(x):
            if x.dtype != self.dtype:
                raise TypeError(f"this product's weight is {self.dtype}; the input is {x.dtype}")
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

    def _one_row_transposed(self, x: Tensor) -> bool:
        """One float32 row, and W^T kept beside the packed weight (the output projection):
        MKL's product on W^T beats oneDNN's blocked one there, most for a large
        vocabulary (a greedy batch-1 step of a 58,101-piece opus-mt projection: about
        half the time; `benchmarks/bench_output_projection.py`)."""
        return (
            self.weight_t is not None
            and self.dtype == torch.float32
            and x.dtype == torch.float32
            and x.numel() == self.in_features
        )

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


_INT8_ENGINES = ("fbgemm", "onednn", "x86")  # PyTorch's int8 CPU kernels ("x86" picks one)
# The engine of `Int8Linear` by default: the faster at decoding's row counts, as
# `benchmarks/bench_int8_kernels.py` measures and records it (`chosen_engine` in
# benchmarks/results/int8-kernels.json; tests/unit/test_int8_products.py keeps the two alike).
INT8_ENGINE = "fbgemm"


class Int8Linear(nn.Module):
    """y = x W^T + b (then ReLU) with W in int8: dynamic quantization on the CPU.

    W is quantized once, symmetrically per output channel (scale_o = max_i |W_oi| /
    127), and packed for one int8 kernel: the module holds no float copy of W. At
    each call x is quantized (asymmetric uint8, from its min and max), multiplied in
    int32 and rescaled to float32 (`torch.ops.quantized.linear_dynamic`). The kernel
    quantizes x per tensor, so that one row with large values would cost the others
    their resolution; with `per_token` (the default) each row of x is first divided
    by its largest |x_ti| and the output multiplied back, which gives every row
    (token) the whole int8 range, at the cost of a division and a multiplication.
    Without it the kernel also adds the bias and ReLU. The packed weight carries its
    engine, whatever `torch.backends.quantized.engine` says later. `INT8_ENGINE` is the
    default; `benchmarks/bench_int8_kernels.py` times the engines against each other,
    per-tensor scales, `torch._int_mm` and `quantize_dynamic` at decoding's and the
    encoder's row counts (docs/explanation/results/cpu-inference.md). Where the engine
    asked for is not built, another serves.

    Args:
        weight: (out, in), float; quantized, not kept.
        bias: (out,) or None.
        relu: apply ReLU to the output.
        engine: "fbgemm", "onednn" or "x86" (PyTorch's choice between the two);
            None: `INT8_ENGINE`.
        per_token: a quantization scale per row of x, rather than one per call.

    Raises:
        ValueError: a weight not on the CPU, or another engine.
        RuntimeError: this PyTorch has no int8 CPU engine (fbgemm or oneDNN).
    """

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None,
        relu: bool = False,
        engine: str | None = None,
        per_token: bool = True,
    ) -> None:
        super().__init__()
        if weight.device.type != "cpu":
            raise ValueError(f"int8 runs on the CPU; this weight is on {weight.device}")
        engine = INT8_ENGINE if engine is None else engine
        if engine not in _INT8_ENGINES:
            raise ValueError(f"engine must be one of {', '.join(_INT8_ENGINES)}, got {engine!r}")
        weight = weight.detach().float()
        self.out_features, self.in_features = weight.shape
        self.relu, self.per_token = relu, per_token
        self.engine = int8_engine(engine)
        # oneDNN's fused ReLU is wrong for a single row (torch 2.13): ReLU apart there
        self.fused_relu = relu and self.engine != "onednn" and not per_token
        self.reduce_range = not torch.cpu._is_vnni_supported()  # fbgemm saturates without VNNI
        scale = int8_scales(weight).double()
        zero = torch.zeros(self.out_features, dtype=torch.long)
        bias = None if bias is None else bias.detach().float().clone()
        self.bias = bias if per_token else None  # added after the rescale; else packed
        previous = torch.backends.quantized.engine
        try:
            torch.backends.quantized.engine = self.engine  # the packed weight keeps its engine
            with _quantized_tensors():
                qweight = torch.quantize_per_channel(weight, scale, zero, 0, torch.qint8)
                self.packed = torch.ops.quantized.linear_prepack(
                    qweight, None if per_token else bias
                )
        finally:
            torch.backends.quantized.engine = previous

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype != torch.float32:
            x = x.float()
        if self.fused_relu:
            return torch.ops.quantized.linear_relu_dynamic(x, self.packed, self.reduce_range)
        if self.per_token and x.numel() > x.size(-1):  # rows scaled to [-1, 1], then back
            scale = x.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-30)  # (..., 1)
            out = torch.ops.quantized.linear_dynamic(x / scale, self.packed, self.reduce_range)
            out = out.mul_(scale) if self.bias is None else torch.addcmul(self.bias, out, scale)
        else:  # per tensor: one row is one token
            out = torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range)
            out = out if self.bias is None else out.add_(self.bias)
        return out.relu_() if self.relu else out

    def dequantized(self) -> tuple[Tensor, Tensor | None]:
        """(W, b) as the kernel multiplies them: W's int8 values times their scales."""
        with _quantized_tensors():
            qweight, bias = torch.ops.quantized.linear_unpack(self.packed)
            return qweight.dequantize(), bias if self.bias is None else self.bias

    def int8_weight(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """The int8 weight as plain tensors, for a compiled step (`int8_product`): the
        packed weight is a TorchScript object that AOTInductor cannot take (torch 2.13:
        "LinearPackedParamsBase ... does not have a field with name '__obj_flatten__'").

        Returns:
            W_q^T (in, out) int8, its (out,) float32 scales (W = W_q x scale per output
            channel, the values the kernel multiplies) and the bias (or None).
        """
        with _quantized_tensors():
            qweight, bias = torch.ops.quantized.linear_unpack(self.packed)
        weight_t = qweight.int_repr().t().contiguous()  # (in, out)
        scale = qweight.q_per_channel_scales().float()  # (out,)
        return weight_t, scale, bias if self.bias is None else self.bias

    def extra_repr(self) -> str:
        per = "token" if self.per_token else "tensor"
        return (
            f"in={self.in_features}, out={self.out_features}, relu={self.relu}, "
            f"int8 {self.engine} per {per}"
        )


def int8_product(
    x: Tensor, weight_t: Tensor, scale: Tensor, bias: Tensor | None, relu: bool = False
) -> Tensor:
    """x W^T + b (then ReLU) with W in int8, in plain tensor operations a compiler takes
    (`Int8Linear.int8_weight`'s tensors): each row of x quantized symmetrically to int8
    (scale max_i |x_ti| / 127), multiplied in int32 (`torch._int_mm`) and rescaled by
    both scales. The rows' rounding differs from `Int8Linear`'s kernel (asymmetric
    uint8 over rows scaled to [-1, 1]), so the two agree to int8's precision, not bit
    for bit.

    Args:
        x: (..., in) float.
        weight_t, scale, bias: W_q^T (in, out) int8, (out,) float32 scales, (out,) or None.
        relu: apply ReLU to the output.

    Returns:
        (..., out) float32.
    """
    rows = x.reshape(-1, x.size(-1)).float()  # (R, in)
    x_scale = rows.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30) / 127  # (R, 1)
    quantized = torch.round(rows / x_scale).to(torch.int8)
    out = torch._int_mm(quantized, weight_t).float() * x_scale * scale  # (R, out)
    if bias is not None:
        out = out + bias
    out = out.reshape(*x.shape[:-1], out.size(-1))
    return out.relu() if relu else out


@contextlib.contextmanager
def _quantized_tensors() -> Iterator[None]:
    """Silence torch's notice that qint8 tensors are deprecated: `Int8Linear` makes one
    only to hand the weight to the packing op, which still takes nothing else."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions")
        yield


def _quantized_engines() -> list[str]:
    """The quantized engines this PyTorch has (none where its int8 operators are gone)."""
    if not hasattr(torch.ops.quantized, "linear_dynamic"):
        return []
    return list(torch.backends.quantized.supported_engines)


def int8_engine(wanted: str | None = None) -> str:
    """`wanted` (one of "fbgemm", "onednn", "x86"; None: `INT8_ENGINE`) if this PyTorch
    has it, else another.

    Raises:
        RuntimeError: neither fbgemm nor oneDNN is built into this PyTorch.
    """
    engines = _quantized_engines()
    wanted = INT8_ENGINE if wanted is None else wanted
    if wanted in engines:
        return wanted
    other = next((e for e in _INT8_ENGINES if e in engines), None)
    if other is None:
        raise RuntimeError(
            "int8 inference needs PyTorch's fbgemm or onednn quantized engine, and this "
            f"build has {engines or 'none'}; use float32 or bfloat16"
        )
    return other


class _Linears:
    """Builds a frozen model's products: `FrozenLinear`, or `Int8Linear` where int8 runs.

    Args:
        int8: quantize products of at least `int8_min_elements` weights.
        int8_output: quantize the output projection too (with `int8`; see `freeze`).
        int8_per_token: `Int8Linear`'s `per_token`.
        int8_min_elements: the smallest weight quantized; None: `INT8_MIN_ELEMENTS`.
    """

    def __init__(
        self,
        int8: bool = False,
        int8_output: bool = False,
        int8_per_token: bool = True,
        int8_min_elements: int | None = None,
    ) -> None:
        self.int8, self.int8_output, self.per_token = int8, int8_output, int8_per_token
        self.min_elements = int8_min_elements

    def _quantizes(self, weight: Tensor) -> bool:
        least = self.min_elements
        least = int8_weights.INT8_MIN_ELEMENTS if least is None else least
        return self.int8 and weight.numel() >= least

    def __call__(
        self, weight: Tensor, bias: Tensor | None, relu: bool = False
    ) -> FrozenLinear | Int8Linear:
        if self._quantizes(weight):
            return Int8Linear(weight, bias, relu, per_token=self.per_token)
        return FrozenLinear(weight, bias, relu)

    def stacked(self, linears: list[nn.Linear], relu: bool = False) -> FrozenLinear | Int8Linear:
        """One product for several maps of the same input, stacked along their outputs."""
        weight = torch.cat([linear.weight for linear in linears])
        biases = [linear.bias for linear in linears]
        bias = None if any(b is None for b in biases) else torch.cat(biases)
        return self(weight, bias, relu)

    def output(self, weight: Tensor, bias: Tensor | None) -> FrozenLinear | Int8Linear:
        """The output projection (one row per hypothesis and step)."""
        if self.int8_output and self._quantizes(weight):
            return Int8Linear(weight, bias, per_token=self.per_token)
        return FrozenLinear(weight, bias, keep_transposed=True)


_FLOAT = _Linears()


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
