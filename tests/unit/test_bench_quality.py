"""benchmarks/bench_quality.py's settings reach `freeze`: "every layer product in int8"
quantizes every product of a model whose products are all below the library's threshold."""

from __future__ import annotations

import torch

from aiayn.config import ModelConfig
from aiayn.inference.frozen import Int8Linear, freeze
from aiayn.io import int8_weights
from aiayn.models import build_model
from benchmarks.bench_quality import every_product_int8


def int8_products(model: torch.nn.Module) -> int:
    return sum(isinstance(m, Int8Linear) for m in model.modules())


def test_every_product_int8_lowers_the_threshold_freeze_reads_and_restores_it():
    model = build_model(ModelConfig.tiny(40, dropout=0.0)).eval()
    default = int8_weights.INT8_MIN_ELEMENTS
    assert int8_products(freeze(model, torch.int8)) == 0  # d_model 64: every product is small
    with every_product_int8():
        lowered = int8_weights.INT8_MIN_ELEMENTS
        assert lowered == 0
        every = int8_products(freeze(model, torch.int8))
    restored = int8_weights.INT8_MIN_ELEMENTS
    assert restored == default
    assert every > 0 and int8_products(freeze(model, torch.int8)) == 0
