"""Affine maps y = x W^T + b that run faster at inference on the CPU.

`nn.Linear` stores W as (out, in) and computes x W^T. For the few-row products of
incremental decoding (one row per sentence or beam), MKL's sgemm with a transposed
right-hand side reaches about 100 GFLOP/s on one AVX-512 core where the same
product with W^T stored (in, out) contiguous reaches about 140 (measured with
d_model 512 and 32 rows; see benchmarks/). So at inference on the CPU, `Linear`
multiplies by a cached contiguous copy of W^T, made once and made again only when
the weight changes. Training (autograd recording) and other devices use F.linear.
The price: a model used for CPU inference holds each weight matrix twice.

A copy is stale when a tensor it was made from has another storage or another
version counter; every in-place update bumps that counter (optimizer steps,
`load_state_dict`, `with torch.no_grad(): w.add_(...)`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Derived:
    """A tensor computed from parameters, recomputed only when one of them changes."""

    def __init__(self) -> None:
        self._stamp: tuple | None = None
        self._value: Tensor | None = None

    def get(self, sources: Sequence[Tensor], build: Callable[[], Tensor]) -> Tensor:
        stamp = tuple((t.data_ptr(), t._version, t.dtype) for t in sources)
        if stamp != self._stamp:
            with torch.no_grad():
                self._value = build()
            self._stamp = stamp
        return self._value


def uses_autograd(*params: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(p is not None and p.requires_grad for p in params)


def affine(x: Tensor, weight_t: Tensor, bias: Tensor | None) -> Tensor:
    """x W^T + b for (..., in) x and a contiguous (in, out) W^T."""
    rows = x.reshape(-1, x.size(-1))
    out = rows @ weight_t if bias is None else torch.addmm(bias, rows, weight_t)
    return out.view(*x.shape[:-1], weight_t.size(1))


def transposed_linear(x: Tensor, weight: Tensor, bias: Tensor | None, cache: Derived) -> Tensor:
    """F.linear(x, weight, bias), through a cached W^T at CPU inference (see the module)."""
    if x.device.type != "cpu" or uses_autograd(x, weight, bias):
        return F.linear(x, weight, bias)
    weight_t = cache.get([weight], lambda: weight.t().contiguous())
    return affine(x, weight_t, bias)


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same names) with the CPU inference path above."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._weight_t = Derived()

    def forward(self, x: Tensor) -> Tensor:
        return transposed_linear(x, self.weight, self.bias, self._weight_t)
