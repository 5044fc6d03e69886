"""int8 in every product (issue 44): `freeze(model, torch.int8, int8_output=True,
int8_min_elements=0)` multiplies every projection in int8 (self- and cross-attention,
feed-forward, output), each equal to a quantization done by hand in plain torch, on each
of PyTorch's int8 engines; and the default engine is the one the benchmark chose."""

from __future__ import annotations

import json

import pytest
import torch
from test_inference import copy_trained_model, sources

from aiayn import ModelConfig, Transformer, freeze
from aiayn.inference.frozen import INT8_ENGINE, FrozenLinear, Int8Linear
from aiayn.io.int8_weights import weight_products
from benchmarks import bench_int8_kernels, common

ENGINES = [
    e for e in ("fbgemm", "onednn", "x86") if e in torch.backends.quantized.supported_engines
]
pytestmark = pytest.mark.skipif(not ENGINES, reason="PyTorch built without an int8 CPU engine")


def hand_quantized_product(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias,
    relu: bool,
    levels: int = 255,
    in_float32: bool = False,
):
    """y = x W^T + b as `Int8Linear` computes it, by hand, in float64 and int64:

    - W per output channel, symmetric: w_o = max_i |W_oi| / 127, Wq = round(W / w_o);
    - x per row: each row divided by its largest |x_ti| (r_t), then the rows together
      onto the unsigned 8-bit grid of their range, zero included: step s = (max - min) /
      255 held as a float32 number, as the kernel holds it, zero point z = round(-min /
      s), xq = clamp(round(x / r / s) + z, 0, 255) (rows scaled to [-1, 1] put z at the
      tie 127.5 in exact arithmetic; the float32 step puts it at 127, as the kernel);
    - the integer product (xq - z) Wq^T, exact in int64 (the kernel's int32 holds it);
    - rescaled: s w_o r_t, plus the bias, then ReLU.

    `levels` 127 instead of 255 is the 7-bit grid of `reduce_range`, where the engine's
    sums of pairs would saturate 16 bits (`Int8Linear.reduce_range`): the step is the
    range / 127, the values still land in the unsigned byte, [0, 255].

    `in_float32`: the zero point -min / s and the grid x / r / s taken in float32, as
    the engines' AVX2 kernels (no VNNI) take them, not in float64. The two differ only
    at ties, which rows scaled to [-1, 1] make: on the 7-bit grid, -min / s = 63.5 in
    float32 (so z = 64, half to even) but 63.4999998 in float64 (z = 63), and a row's
    -1 lands on -63.5 steps (-64) against -63.4999998 (-63).
    """
    w_scale = weight.double().abs().amax(dim=1) / 127  # (out,)
    w_q = torch.round(weight.double() / w_scale[:, None]).clamp(-127, 127).long()
    rows = x.double().reshape(-1, x.size(-1))
    r = rows.abs().amax(dim=1, keepdim=True)  # (rows, 1)
    normed = rows / r
    low, high = min(normed.min().item(), 0.0), max(normed.max().item(), 0.0)
    step32 = torch.tensor(high - low, dtype=torch.float32).div(levels)
    step = step32.item()
    if in_float32:
        zero = int(torch.round(-low / step32).item())
        x_q = (torch.round(normed.float() / step32).double() + zero).clamp(0, 255).long()
    else:
        zero = round(-low / step)
        x_q = (torch.round(normed / step) + zero).clamp(0, 255).long()
    y = ((x_q - zero) @ w_q.t()).double() * step * w_scale[None, :] * r  # integer product
    y = y if bias is None else y + bias.double()
    y = y.relu() if relu else y
    return y.reshape(*x.shape[:-1], weight.size(0))


def float_products(model: Transformer) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(W, b) of each product `freeze` builds, in its order (stacked maps concatenated)."""
    products = []
    for linears in weight_products(model):
        bias = [linear.bias for linear in linears]
        products.append(
            (
                torch.cat([linear.weight for linear in linears]).detach(),
                None if None in bias else torch.cat(bias).detach(),
            )
        )
    return products


def frozen_products(frozen) -> list[torch.nn.Module]:
    out = []
    for stack in (frozen.encoder, frozen.decoder):
        for layer in stack.layers:
            if hasattr(layer, "self_attn"):
                out += [layer.self_attn.qkv_proj, layer.self_attn.out_proj]
            if hasattr(layer, "cross_attn"):
                out += [layer.cross_attn.q_proj, layer.cross_attn.kv_proj]
                out += [layer.cross_attn.out_proj]
            out += [layer.feed_forward.linear1, layer.feed_forward.linear2]
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_every_int8_product_equals_the_hand_quantized_one(engine, monkeypatch):
    """Tolerance 1e-4 + 1e-5 |y|: the rescale's float32 rounding (measured 2.5e-6 at
    |y| ~ 20). One step of an activation's grid moves an output by about 1e-2 here, so a
    wrong scale, zero point, rounding or a float product fails by far more."""
    monkeypatch.setattr("aiayn.inference.frozen_products.INT8_ENGINE", engine)  # freeze's products
    torch.manual_seed(0)
    model = Transformer(ModelConfig.tiny(vocab_size=40, d_model=32, d_ff=64, dropout=0.0)).eval()
    frozen = freeze(model, torch.int8, int8_output=True, int8_min_elements=0)
    products = frozen_products(frozen)
    quantized = [m for m in frozen.modules() if isinstance(m, Int8Linear)]
    assert len(quantized) == len(products) + 1  # and the output projection
    assert all(isinstance(m, Int8Linear) and m.engine == engine for m in products)
    pairs = [*zip(products, float_products(model), strict=True)]
    pairs.append((frozen.output, (model.output_weight().detach(), model.output_bias)))
    generator = torch.Generator().manual_seed(1)
    for product, (weight, bias) in pairs:
        # 5 rows of very different sizes, one all but zero: per-row scales matter
        sizes = torch.tensor([1e-3, 0.1, 1.0, 10.0, 3.0])[:, None]
        x = torch.randn(5, weight.size(1), generator=generator) * sizes
        with torch.no_grad():
            got = product(x).double()
        levels = 127 if product.reduce_range else 255
        # the engine's arithmetic, float64 or float32, is the hand model it comes closest to
        expected = min(
            (
                hand_quantized_product(x, weight, bias, product.relu, levels, f32)
                for f32 in (False, True)
            ),
            key=lambda hand: (got - hand).abs().max().item(),
        )
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
        in_float = torch.nn.functional.linear(x, weight, bias).double()
        in_float = in_float.relu() if product.relu else in_float
        assert (got - in_float).abs().max() > 1e-3  # it did run in int8


def test_every_product_in_int8_keeps_the_logits_near_float32():
    """Every product int8, the output projection too, on the tiny trained copy model: the
    logits move by at most 5% of their spread (a lost scale or ReLU moves them by the
    whole spread), and float32 freezing is untouched by the int8 options."""
    model = copy_trained_model()
    every = freeze(model, torch.int8, int8_output=True, int8_min_elements=0)
    assert isinstance(every.output, Int8Linear)
    assert isinstance(every.decoder.layers[0].cross_attn.q_proj, Int8Linear)  # 32 x 32
    default = freeze(model, torch.int8)  # d_model 32: every product below the threshold
    assert not any(isinstance(m, Int8Linear) for m in default.modules())
    fp32 = freeze(model, int8_min_elements=0)  # no int8 without torch.int8
    assert not any(isinstance(m, Int8Linear) for m in fp32.modules())
    assert isinstance(fp32.output, FrozenLinear)
    src = sources(16)
    tgt = torch.randint(3, 16, (5, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model.decode(tgt, model.encode(src))
        got = every.decode(tgt, every.encode(src))
        same = fp32.decode(tgt, fp32.encode(src))
    spread = expected.max() - expected.min()
    assert 0 < (got - expected).abs().max() <= 0.05 * spread
    torch.testing.assert_close(same, expected, rtol=0, atol=1e-5)


def test_the_default_engine_is_the_one_the_benchmark_measured_faster():
    records = json.loads((common.RESULTS / "int8-kernels.json").read_text())["results"]
    chosen, means = bench_int8_kernels.choose_engine(records)
    assert chosen == INT8_ENGINE, (
        f"the results choose {chosen} ({means}); frozen says {INT8_ENGINE}"
    )


def test_the_engine_choice_is_the_highest_geometric_mean_at_decoding_rows():
    def record(system, rows, speed):
        return dict(shape="s", rows=rows, system=system, vs_fp32=speed)

    records = [
        record("int8 fbgemm", 1, 2.0), record("int8 fbgemm", 32, 0.5),  # mean 1.0
        record("int8 onednn", 1, 1.1), record("int8 onednn", 32, 1.1),  # mean 1.1
        record("int8 onednn", 960, 0.01),  # the encoder's rows do not count
        record("int8 fbgemm, per tensor", 1, 9.0), record("fp32", 1, 1.0),
    ]  # fmt: skip
    chosen, means = bench_int8_kernels.choose_engine(records)
    assert chosen == "onednn" and means == pytest.approx({"fbgemm": 1.0, "onednn": 1.1})
    assert bench_int8_kernels.choose_engine([]) == (None, {})
