"""Affine maps y = x W^T + b that run faster at inference on the CPU.

At inference on the CPU (no autograd recording, float32 or bfloat16), `Linear`
multiplies by a copy of its weight made once, in the layout the fastest kernel
wants, and made again only when the weight changes:

- Large weights (at least `PACK_MIN_ELEMENTS`: the output projection, the FFN of
  the base model) multiplied by at least `PACK_MIN_ROWS` rows are packed by
  oneDNN into its blocked layout (`torch.ops.mkldnn`, the primitive
  `torch.compile` uses for frozen linear layers); the bias and an optional ReLU
  are applied inside the kernel. A general
  matrix product instead re-packs W at every call, which for the few-row products
  of incremental decoding costs as much as the multiplication.
- Otherwise the weight is stored transposed, (in, out) contiguous, for MKL's
  sgemm: oneDNN's fixed cost per call (~15 us) exceeds what packing saves for
  small weights, and MKL's matrix-vector kernels win for a few rows.

Measured on the 2-core AVX-512 Xeon of the benchmarks, 32 rows (one decoding step
of 32 sentences), caches flushed: a 8000 x 512 weight 2.1 ms with F.linear, 1.7 ms
transposed, 1.3 ms packed; 256 x 256: 68, 63 and 94 us. One row (one sentence)
times 8000 x 512: 314 us with F.linear, 283 transposed, 357 packed.

A copy is stale when a tensor it was made from has another storage or another
version counter (every in-place update through the tensor bumps the counter:
`load_state_dict`, `with torch.no_grad(): w.add_(...)`), or when any
`torch.optim` optimizer has stepped since it was made: fused optimizers
(`Adam(fused=True)`, aiayn's default) update parameters without bumping their
counters. Weights changed behind both (through `.data`, or by a kernel outside
`torch.optim`) need `refresh_inference_weights()`. Training (autograd
recording), other devices, other dtypes (float64 in the exactness tests) and
PyTorch builds without oneDNN use F.linear. The price: a model used for CPU
inference holds each weight matrix twice (a large one three times, when it is
used with both few and many rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

PACK_MIN_ELEMENTS = 1 << 20  # weights from this size may be packed by oneDNN...
PACK_MIN_ROWS = 16  # ...when multiplied by this many rows or more
_FAST_DTYPES = (torch.float32, torch.bfloat16)
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


_generation = 0  # bumped by every optimizer step: copies made before it are stale


def refresh_inference_weights() -> None:
    """Make every `Derived` copy stale (after changing weights behind PyTorch's back)."""
    global _generation
    _generation += 1


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    refresh_inference_weights()


register_optimizer_step_post_hook(_after_optimizer_step)


class Derived:
    """A tensor computed from parameters, recomputed only when one of them changes."""

    def __init__(self) -> None:
        self._stamp: tuple | None = None
        self._value: Tensor | None = None

    def get(self, sources: Sequence[Tensor], build: Callable[[], Tensor]) -> Tensor:
        stamp = (_generation, *((t.data_ptr(), t._version, t.dtype) for t in sources))
        if stamp != self._stamp:
            with torch.no_grad():
                self._value = build()
            self._stamp = stamp
        return self._value


class InferenceWeights:
    """The two layouts of one weight (or stack of weights) for CPU inference."""

    def __init__(self) -> None:
        self.transposed = Derived()
        self.packed = Derived()


def uses_autograd(*params: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(p is not None and p.requires_grad for p in params)


def cpu_inference(x: Tensor, *params: Tensor | None) -> bool:
    """Whether `x` times these parameters takes one of the CPU inference paths."""
    return (
        x.device.type == "cpu"
        and x.dtype in _FAST_DTYPES
        and params[0].dtype == x.dtype
        and not uses_autograd(x, *params)
    )


def fast_linear(
    x: Tensor,
    weights: Sequence[Tensor],
    bias: Tensor | None,
    cache: InferenceWeights,
    relu: bool = False,
) -> Tensor:
    """x [W_1; W_2; ...]^T + b, then ReLU if asked, where `cpu_inference` holds.

    Several weights are stacked along their output dimension (self-attention's
    W^Q, W^K, W^V: one product instead of three). See the module for the paths.
    """
    out_features = sum(w.size(0) for w in weights)
    large = out_features * weights[0].size(1) >= PACK_MIN_ELEMENTS
    if _ONEDNN and large and math.prod(x.shape[:-1]) >= PACK_MIN_ROWS:
        packed = cache.packed.get(weights, lambda: _onednn_pack(_stack(weights)))
        attr = "relu" if relu else "none"
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, attr, [], "")
    weight_t = cache.transposed.get(weights, lambda: _stack(weights).t().contiguous())
    rows = x.reshape(-1, x.size(-1))
    out = rows @ weight_t if bias is None else torch.addmm(bias, rows, weight_t)
    out = out.view(*x.shape[:-1], out_features)
    return out.relu_() if relu else out


def _stack(weights: Sequence[Tensor]) -> Tensor:
    return weights[0] if len(weights) == 1 else torch.cat(list(weights))


def _onednn_pack(weight: Tensor) -> Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)


def inference_linear(
    x: Tensor, weight: Tensor, bias: Tensor | None, cache: InferenceWeights, relu: bool = False
) -> Tensor:
    """F.linear(x, weight, bias) (then ReLU if asked), faster at CPU inference (see the module)."""
    if cpu_inference(x, weight, bias):
        return fast_linear(x, [weight], bias, cache, relu)
    out = F.linear(x, weight, bias)
    return F.relu(out) if relu else out


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same names) with the CPU inference path above."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._fast_weight = InferenceWeights()

    def forward(self, x: Tensor, relu: bool = False) -> Tensor:
        """x W^T + b, followed by ReLU when `relu` (fused into the kernel where packed)."""
        return inference_linear(x, self.weight, self.bias, self._fast_weight, relu)
