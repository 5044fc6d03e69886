"""The products of a frozen model: float (`FrozenLinear`) and int8 (`Int8Linear`).

`aiayn.inference.frozen.freeze` builds every linear map of the model it freezes through
`_Linears`: a `FrozenLinear` (float32 or bfloat16, in the layout its fastest kernel
wants: oneDNN's packed weight, or MKL's product on W^T for one row), or an `Int8Linear`
(int8 weights per output channel, activations quantized per token at run time, on
PyTorch's int8 engine `INT8_ENGINE`) where the product is large enough for int8 to gain.
`int8_product` is the same int8 product over plain tensors, for compilers that cannot
take PyTorch's packed int8 weights.

Shape legend: N rows (tokens), I input features, O output features.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.io import int8_weights
from aiayn.io.int8_weights import int8_scales

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
        self.reduce_range = _sums_saturate(self.engine)
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


def _sums_saturate(engine: str) -> bool:
    """Whether `engine`'s u8 x s8 products add pairs in 16 bits and saturate there: on a
    CPU without VNNI (fbgemm's and oneDNN's AVX2 kernels), and in oneDNN wherever
    ONEDNN_MAX_CPU_ISA caps it below VNNI (as the portability audit's AVX2 kernel set
    does on a VNNI CPU). Activations then take 7 bits (`reduce_range`), which keeps every
    pair's sum in range."""
    if not torch.cpu._is_vnni_supported():
        return True
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    vnni = cap in ("ALL", "DEFAULT") or any(k in cap for k in ("VNNI", "BF16", "FP16", "AMX"))
    return engine == "onednn" and not vnni


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
