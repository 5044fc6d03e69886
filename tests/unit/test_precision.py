"""Training precision: what fp16 needs, and the autocast context of each precision."""

from __future__ import annotations

import pytest
import torch

from aiayn.config import Precision
from aiayn.training.precision import autocast, grad_scaler, training_precision

CPU = torch.device("cpu")


def test_fp16_training_needs_cuda():
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        training_precision(Precision.FP16, CPU)
    assert training_precision(Precision.BF16, CPU) is Precision.BF16


@pytest.mark.parametrize(
    ("precision", "dtype"), [(Precision.FP32, torch.float32), (Precision.BF16, torch.bfloat16)]
)
def test_autocast_runs_matrix_products_in_the_precision(precision, dtype):
    a = torch.ones(2, 2)
    with autocast(precision, CPU):
        assert (a @ a).dtype is dtype
    assert not grad_scaler(precision, CPU).is_enabled()
