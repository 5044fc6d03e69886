"""The formula written out: softmax(Q K^T / sqrt(d_k) + bias) V, weights always computed."""

from __future__ import annotations

from torch import Tensor

from aiayn.nn.kernels import KERNELS, Kernel
from aiayn.nn.kernels.sdpa import attend


@KERNELS.register("explicit")
class ExplicitKernel(Kernel):
    """`attend` on its explicit path (the weights are computed even when not returned):
    the reference the fused path is tested against, and the one to read."""

    dense_softmax = True
    exact_in_hf = True
    static_step = True

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
        out, weights = attend(q, k, v, mask, causal, dropout_p, True, bias)
        return out, weights if need_weights else None
