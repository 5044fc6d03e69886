"""The decoding race's aiayn systems (benchmarks/decode_systems.py) freeze what their names
say: "aiayn-int8" every product in int8, the output projection included (before issue 44
it ran with a float32 output, the same model as "aiayn-int8-fp32out")."""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, Transformer
from aiayn.inference.frozen import FrozenLinear, Int8Linear
from benchmarks import decode_systems

pytestmark = pytest.mark.skipif(
    not {"fbgemm", "onednn"} & set(torch.backends.quantized.supported_engines),
    reason="PyTorch built without an int8 CPU engine",
)


def model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.tiny(vocab_size=40, d_model=32, d_ff=64, dropout=0.0)).eval()


def test_int8_with_int8_output_is_every_product_in_int8():
    every = decode_systems.frozen(model(), "int8", int8_output=True)
    layer = every.decoder.layers[0]
    products = [layer.self_attn.qkv_proj, layer.cross_attn.q_proj, layer.feed_forward.linear2]
    assert all(isinstance(p, Int8Linear) for p in [*products, every.output])


def test_int8_with_fp32_output_is_what_dtype_int8_ships():
    shipped = decode_systems.frozen(model(), "int8", int8_output=False)
    assert isinstance(shipped.output, FrozenLinear)
    # d_model 32: every product is below INT8_MIN_ELEMENTS, so float32 as `--dtype int8`
    assert not any(isinstance(m, Int8Linear) for m in shipped.modules())
    assert not any(
        isinstance(m, Int8Linear) for m in decode_systems.frozen(model(), "fp32", True).modules()
    )
