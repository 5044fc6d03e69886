"""plain_softmax: softmax(Q K^T / sqrt(d_k) + bias) V written out with einsum.

The same attention as aiayn's `sdpa` and `explicit` kernels, computed its own way, so it
declares what they declare: dense softmax, exact in Hugging Face's attention (its models
export), the static decoding step (its per-slot stores and float bias), a causal form.

Shape legend: B batch, H query heads, Hkv key/value heads, T queries, S keys, D head size.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.nn.kernels import KERNELS, Kernel


@KERNELS.register("plain_softmax")
class PlainSoftmaxKernel(Kernel):
    """Dense softmax attention in einsum; the weights always computed."""

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
        groups = q.size(1) // k.size(1)  # query heads per key/value head
        k = k.repeat_interleave(groups, dim=1)  # (B, H, S, D)
        v = v.repeat_interleave(groups, dim=1)
        scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(q.size(-1))
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        t_len, s_len = q.size(-2), k.size(-2)
        allowed = torch.ones(t_len, s_len, dtype=torch.bool, device=q.device)
        if causal:  # the queries are the last T of S positions
            allowed = allowed.tril(diagonal=s_len - t_len)
        if mask is not None:
            allowed = allowed & mask
        scores = scores.masked_fill(~allowed, float("-inf"))
        has_key = allowed.any(dim=-1, keepdim=True)  # a query with no key gets zeros
        weights = scores.masked_fill(~has_key, 0.0).softmax(dim=-1) * has_key
        out = torch.einsum("bhts,bhsd->bhtd", F.dropout(weights, p=dropout_p), v)
        return out, weights if need_weights else None
