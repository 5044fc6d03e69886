"""Scaled dot-product attention (section 3.2.1), and the default kernel that runs it.

Shape legend: B batch, H query heads, Hkv key/value heads (H is a multiple of Hkv),
T query length, S key/value length, Dk query/key head size, Dv value head size.

`attend` is the attention math alone, with a written contract: bool masks
(True = may attend), bottom-right causal alignment when T < S (the earlier keys
come from a cache), a float bias added to the scaled scores, and a zero output, not
NaN, for a query with no key to attend. It has two paths with one meaning: PyTorch's
fused `scaled_dot_product_attention`, and the formula written out, which also
returns the weights. `SdpaKernel` is the kernel that calls it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.nn.kernels import KERNELS, Kernel
from aiayn.nn.masks import causal_mask


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T / sqrt(d_k) + bias) V, with masked scores set to -inf before the softmax.

    Two paths with one meaning: `torch.nn.functional.scaled_dot_product_attention`
    (fused kernels, FlashAttention-class on GPU), and an explicit path that also
    returns the attention weights. The explicit path runs when the weights are asked
    for, and in a training step on the CPU where it is the faster of the two
    (`explicit_is_faster`). A query that may attend no key at all (a fully padded
    row) gets a zero output and zero weights, not NaN. A position bias goes to SDPA
    as a float mask, so the fused path stays.

    Args:
        q: (B, H, T, Dk) queries.
        k: (B, Hkv, S, Dk) keys.
        v: (B, Hkv, S, Dv) values.
        mask: bool, broadcastable to (B, H, T, S); True = may attend.
        causal: also forbid keys after each query; with T < S the queries are the
            last T positions (the earlier keys come from a cache).
        dropout_p: dropout on the attention weights.
        need_weights: take the explicit path and return the weights (they may be the
            softmax's own output, kept for the backward pass: edit a copy, not them).
        bias: float, broadcastable to (B, H, T, S), added to the scaled scores
            (relative-position biases, ALiBi).

    Returns:
        (B, H, T, Dv) outputs and, if `need_weights`, the (B, H, T, S) weights.
    """
    n_heads, n_kv_heads = q.size(1), k.size(1)
    if n_heads % n_kv_heads != 0:
        raise ValueError(
            f"query heads ({n_heads}) must be a multiple of key/value heads ({n_kv_heads})"
        )
    explicit = need_weights or explicit_is_faster(q, k)
    if causal:
        t_len, s_len = q.size(-2), k.size(-2)
        if t_len == 1:
            causal = False  # one query, the newest position: it may attend every key
        elif mask is not None or bias is not None or explicit or t_len != s_len:
            # SDPA's is_causal aligns to the top-left; with a cache we need bottom-right.
            causal_part = causal_mask(t_len, s_len, device=q.device)
            mask = causal_part if mask is None else mask & causal_part
            causal = False
    dtype = q.dtype
    in_float32 = not explicit and _float32_under_cpu_autocast(q)
    if in_float32:  # see _float32_under_cpu_autocast
        q, k, v = q.float(), k.float(), v.float()
    # Rows with no key to attend: let them attend everything, zero them afterwards,
    # so that neither the output nor its gradient becomes NaN.
    has_key = None
    if mask is not None:
        has_key = mask.any(dim=-1, keepdim=True)  # (.., T, 1)
        if _every_row_has_a_key(has_key):
            has_key = None  # the common case: no pass over the scores or outputs for it
        else:
            mask = mask | ~has_key
    scores_mask = mask
    if bias is not None:
        if bias.dtype != q.dtype:  # (a cast to the same dtype is still a call)
            bias = bias.to(q.dtype)
        scores_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))

    if not explicit:
        gqa = n_kv_heads != n_heads
        if in_float32:
            with torch.autocast("cpu", enabled=False):
                out = F.scaled_dot_product_attention(
                    q, k, v, scores_mask, dropout_p, causal, enable_gqa=gqa
                ).to(dtype)
        else:  # (the common path: no context manager to enter at every call)
            out = F.scaled_dot_product_attention(
                q, k, v, scores_mask, dropout_p, causal, enable_gqa=gqa
            )
        if has_key is not None:
            out = out.masked_fill(~has_key, 0.0)
        return out, None

    if n_kv_heads != n_heads:  # each key/value head serves a group of query heads
        k = k.repeat_interleave(n_heads // n_kv_heads, dim=1)
        v = v.repeat_interleave(n_heads // n_kv_heads, dim=1)
    # in place: the product's backward needs q and k, not the scores
    scores = (q @ k.transpose(-2, -1)).mul_(1.0 / math.sqrt(q.size(-1)))  # (B, H, T, S)
    if scores_mask is not None and scores_mask.dtype == torch.bool:
        scores = scores.masked_fill_(~scores_mask, float("-inf"))
    elif scores_mask is not None:
        scores = scores.add_(scores_mask)
    weights = scores.softmax(dim=-1)
    if has_key is not None:
        weights = weights.masked_fill(~has_key, 0.0)
    out = F.dropout(weights, p=dropout_p) @ v  # (B, H, T, Dv)
    return out, (weights if need_weights else None)


# The most scores (T x S) per head for which the explicit path wins a training step on
# the CPU, by the dtype of the queries (bf16 under autocast): measured forward and
# backward, padded and causal masks, heads of 32 and 64, by
# benchmarks/bench_attention_paths.py (benchmarks/results/attention-paths.json).
EXPLICIT_MAX_SCORES = {torch.bfloat16: 256 * 256, torch.float32: 64 * 64}


def explicit_is_faster(q: Tensor, k: Tensor) -> bool:
    """Whether the explicit path beats SDPA's fused kernels for these queries and keys.

    Only in a training step on the CPU (gradients wanted), for up to
    `EXPLICIT_MAX_SCORES` scores per head: there PyTorch's fused CPU kernels spend more
    on blocking than short sequences need (in bfloat16 they are slower than in float32,
    `_float32_under_cpu_autocast`), while the formula written out is three batched
    products and a softmax. Inference (no gradients) keeps SDPA, as it was measured
    and tested before this rule.

    Args:
        q: (B, H, T, Dk) queries.
        k: (B, Hkv, S, Dk) keys.

    Returns:
        True where the explicit path is the faster.
    """
    if q.device.type != "cpu" or not (torch.is_grad_enabled() and q.requires_grad):
        return False
    limit = EXPLICIT_MAX_SCORES.get(q.dtype, 0)
    return q.size(-2) * k.size(-2) <= limit


def _every_row_has_a_key(has_key: Tensor) -> bool:
    """Whether every query may attend some key, read eagerly (a few bools: microseconds).

    Almost always true (a row with no key is a fully padded one), and then the masking of
    rows without keys, a pass over the (B, H, T, S) weights, is skipped. A graph being
    compiled or exported cannot branch on a value: there the masking always runs.
    """
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    return bool(has_key.all())


def _float32_under_cpu_autocast(q: Tensor) -> bool:
    """Whether the fused path runs in float32 although CPU autocast gave it bfloat16.

    Mixed-precision training on the CPU (`TrainConfig.precision` bf16) autocasts the
    projections to bfloat16, and SDPA with them; but PyTorch's CPU kernels of fused
    attention are slower in bfloat16 than in float32 (forward and backward;
    `benchmarks/profile_train.py` shows it), so the attention itself is computed in float32, as the softmax of
    mixed-precision training usually is, and its output returned in bfloat16.
    """
    return q.dtype == torch.bfloat16 and q.device.type == "cpu" and torch.is_autocast_enabled("cpu")


@KERNELS.register("sdpa")
class SdpaKernel(Kernel):
    """`aiayn.nn.attention.attend`: SDPA's fused kernels (FlashAttention-class on a GPU),
    and its explicit path when the weights are asked for."""

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
        return attend(q, k, v, mask, causal, dropout_p, need_weights, bias)
