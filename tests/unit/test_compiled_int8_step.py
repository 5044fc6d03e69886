"""A decoding step with int8 products compiled ahead of time (issue 44, "no Python between
layers"): AOTInductor cannot take `Int8Linear`'s packed weight (a TorchScript object), so
a compiled step multiplies by `int8_product` over the int8 weight's plain tensors.

Checked against an integer product quantized by hand, and the compiled greedy step
against the eager step with the same products, at every step.
"""

from __future__ import annotations

import logging

import pytest
import torch
from test_static_step import small, sources

from aiayn import freeze
from aiayn.inference.frozen import FrozenLinear, Int8Linear, int8_product
from aiayn.inference.static_step import StaticStep, has_slow_int8_products


def test_int8_product_is_the_integer_product_quantized_by_hand():
    torch.manual_seed(0)
    weight, bias = torch.randn(6, 5), torch.randn(6)
    x = torch.randn(2, 3, 5)
    linear = Int8Linear(weight, bias, relu=True)
    weight_t, scale, held_bias = linear.int8_weight()
    assert weight_t.dtype == torch.int8 and weight_t.shape == (5, 6)
    # the weight the kernel multiplies, and the scales of `int8_scales`: max |W_o.| / 127
    torch.testing.assert_close(scale, weight.abs().amax(dim=1) / 127)
    torch.testing.assert_close(weight_t.t().float() * scale[:, None], linear.dequantized()[0])
    assert weight_t.abs().amax(dim=0).tolist() == [127] * 6  # each channel's largest
    torch.testing.assert_close(held_bias, bias)
    # by hand: each row of x to int8 with its own scale, an int64 product, both scales
    rows = x.reshape(6, 5)
    x_scale = rows.abs().amax(dim=1, keepdim=True) / 127
    x_int = torch.round(rows / x_scale).long()
    expected = (x_int @ weight_t.long()).double() * x_scale.double() * scale.double() + bias
    expected = expected.clamp_min(0).reshape(2, 3, 6).float()
    got = int8_product(x, weight_t, scale, held_bias, relu=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # and within int8's precision of the packed kernel's own product
    torch.testing.assert_close(got, linear(x), atol=0.05, rtol=0.05)


@pytest.mark.slow
def test_the_compiled_greedy_step_with_int8_products_equals_the_eager_one(monkeypatch):
    # one AOTInductor compilation (about a minute on 2 busy cores): the float32 products
    # oneDNN-packed (compiled through plain copies), the larger ones in int8
    monkeypatch.setattr("aiayn.inference.frozen_products.PACK_MIN_ELEMENTS", 1)
    model = freeze(small("encoder_decoder"), torch.int8, int8_min_elements=2048)
    products = [m for m in model.modules() if isinstance(m, Int8Linear | FrozenLinear)]
    assert {type(m) for m in products} == {Int8Linear, FrozenLinear}  # both kinds
    eager, compiled = StaticStep(model, slots=2), StaticStep(model, slots=2)
    eager.trim = False  # the compiled step's fixed shapes
    eager.attention.unpack(model)  # the same products: int8_product, plain float copies
    for step in (eager, compiled):
        step.load_source(torch.arange(2), sources(2, seed=9))
    assert compiled.compile(log_probs=True, ahead_of_time=True) > 0
    for step in (eager, compiled):  # another source after compiling: read, not baked in
        step.load_source(torch.arange(2), sources(2))
    tokens = torch.full((2,), model.cfg.bos_id)
    steps = []
    for t in range(10):  # greedy: each step's argmax is the next step's input (eos
        positions = torch.full((2,), t)  # forbidden, as the benchmarks' fixed lengths do)
        expected = eager.log_probs(tokens, positions)
        torch.testing.assert_close(
            compiled.log_probs(tokens, positions), expected, atol=1e-5, rtol=0
        )
        tokens = expected[:, 3:].argmax(dim=-1) + 3  # past pad, bos and eos
        steps.append(expected[:, 3:])
    # not a test that cannot fail: the rows and the steps give different log-probabilities
    assert (steps[0][0] - steps[0][1]).abs().max() > 0.1
    assert (steps[1] - steps[-1]).abs().max() > 1e-3


@pytest.mark.parametrize("vnni", [True, False])
def test_compiling_int8_products_without_vnni_warns(monkeypatch, caplog, vnni):
    # torch._int_mm is fast only with VNNI (218 ms compiled against 13.7 eager on an
    # AVX2-only CPU): a compiled int8 step says so there, and nowhere else
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: vnni)
    int8 = freeze(small("encoder_decoder"), torch.int8, int8_min_elements=2048)
    floats = freeze(small("encoder_decoder"), torch.float32)
    assert has_slow_int8_products(int8) is not vnni
    assert has_slow_int8_products(floats) is False
    step = StaticStep(int8, slots=2)
    monkeypatch.setattr("torch.compile", lambda fn, **_: fn)  # only the warning is wanted
    step.load_source(torch.arange(2), sources(2))
    with caplog.at_level(logging.WARNING, logger="aiayn.inference.static_step"):
        step.compile(log_probs=True)
    warned = [r for r in caplog.records if "without VNNI" in r.getMessage()]
    assert len(warned) == (0 if vnni else 1)
