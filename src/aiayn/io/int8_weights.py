"""int8 weights: which weights int8 inference multiplies in int8, how they are rounded,
and how a weights file stores them.

`aiayn.inference.frozen.freeze(model, torch.int8)` multiplies the weights that
`int8_weight_names` names in int8 (`Int8Linear`), each rounded as `quantize_weight`
rounds it: symmetric, one float32 scale per output channel. `aiayn.io.checkpoint.save_model(...,
int8=True)` stores those weights as the int8 values and their scales, and loading
dequantizes them; so a file of int8 weights gives the same int8 products as the float
weights it came from. Both sides import this module, which is why it lives below them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.layers import FeedForward

INT8_MIN_ELEMENTS = 1 << 16  # int8 products from this weight size (128 x 512); smaller stay fp32


def int8_scales(weight: Tensor) -> Tensor:
    """(out,) float32: the symmetric per-output-channel scales of `Int8Linear`,
    max_i |W_oi| / 127 (1 for an all-zero row)."""
    scale = weight.detach().float().abs().amax(dim=1) / 127
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """W as `Int8Linear` rounds it: (int8 (out, in), float32 scales (out,)).

    `dequantize_weight` of the pair is the W the int8 kernel multiplies, and
    `Int8Linear` of that W rounds to the same int8 values again (its largest |W_oi| is
    127 scales), so a file of int8 weights (`aiayn convert marian --dtype int8`) loads
    to the same int8 products as the float weights it came from.
    """
    scale = int8_scales(weight)
    values = (weight.detach().float() / scale[:, None]).round().clamp(-127, 127)
    return values.to(torch.int8), scale


def dequantize_weight(values: Tensor, scale: Tensor) -> Tensor:
    """float32 (out, in): int8 `values` times their per-row `scale`."""
    return values.float() * scale.float()[:, None]


def weight_products(model: nn.Module) -> list[list[nn.Linear]]:
    """The matrix products `aiayn.inference.frozen.freeze` builds from a model's layers, each as the list of
    `nn.Linear` maps stacked into it (self-attention's W^Q, W^K, W^V are one product;
    cross-attention's W^Q is one and W^K, W^V another; each W^O and FFN map is one)."""
    products = []
    for stack in (getattr(model, "encoder", None), getattr(model, "decoder", None)):
        for layer in [] if stack is None else stack.layers:
            self_attn, cross_attn = (
                getattr(layer, "self_attn", None),
                getattr(layer, "cross_attn", None),
            )
            if isinstance(self_attn, MultiHeadAttention):
                products += [[self_attn.q_proj, self_attn.k_proj, self_attn.v_proj]]
                products += [[self_attn.out_proj]]
            if isinstance(cross_attn, MultiHeadAttention):
                products += [[cross_attn.q_proj], [cross_attn.k_proj, cross_attn.v_proj]]
                products += [[cross_attn.out_proj]]
            ffn = getattr(layer, "feed_forward", None)
            if isinstance(ffn, FeedForward):
                products += [[ffn.linear1], [ffn.linear2]]
    return products


def int8_weight_names(model: nn.Module) -> list[str]:
    """The names (as in `model.state_dict()`) of the weights that `freeze(model,
    torch.int8)` multiplies in int8: those of the products of at least
    `INT8_MIN_ELEMENTS` weights, the output projection excluded, and none of an
    attention block with a head mask (its W^O is scaled before quantizing)."""
    names = {id(p): name for name, p in model.named_parameters()}
    masked = {
        id(linear)
        for module in model.modules()
        if isinstance(module, MultiHeadAttention) and module.head_mask is not None
        for linear in (module.q_proj, module.k_proj, module.v_proj, module.out_proj)
    }
    chosen = []
    for product in weight_products(model):
        if any(id(linear) in masked for linear in product):
            continue
        if sum(linear.weight.numel() for linear in product) >= INT8_MIN_ELEMENTS:
            chosen += [names[id(linear.weight)] for linear in product]
    return chosen
