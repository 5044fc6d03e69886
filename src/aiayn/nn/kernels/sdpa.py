"""The default kernel: PyTorch's fused scaled dot-product attention (section 3.2.1)."""

from __future__ import annotations

from torch import Tensor

from aiayn.nn.attention import attend
from aiayn.nn.kernels import KERNELS, Kernel


@KERNELS.register("sdpa")
class SdpaKernel(Kernel):
    """`aiayn.nn.attention.attend`: SDPA's fused kernels (FlashAttention-class on a GPU),
    and its explicit path when the weights are asked for."""

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
        return attend(q, k, v, mask, causal, dropout_p, need_weights, bias)
