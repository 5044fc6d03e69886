"""aiayn.nn.dropout: the CPU mask has the stated drop rate, scaling, gradient and seeding."""

import math

import pytest
import torch

from aiayn.nn.dropout import Dropout, drop_probability, dropout, keep_mask


def test_drop_probability_is_p_rounded_to_sixteen_bits():
    assert drop_probability(0.1) == 6554 / 65536
    assert drop_probability(0.5) == 0.5
    assert drop_probability(0.0) == 0.0


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keep_rate_matches_at_every_position_of_the_three_uniforms(p):
    torch.manual_seed(0)
    n = 3 * 200_000
    keep = keep_mask((n,), p).float()
    expected = 1 - drop_probability(p)
    sigma = math.sqrt(expected * (1 - expected) / (n / 3))
    for chunk in range(3):  # each 16-bit chunk of a random word is uniform
        assert abs(keep[chunk::3].mean().item() - expected) < 5 * sigma


def test_masks_are_independent_of_each_other_and_reproducible_from_the_seed():
    torch.manual_seed(1)
    a, b = keep_mask((1000,), 0.5), keep_mask((1000,), 0.5)
    torch.manual_seed(1)
    assert torch.equal(keep_mask((1000,), 0.5), a)
    assert (a == b).float().mean().item() < 0.6  # two draws, not one mask repeated


def test_kept_elements_are_scaled_by_the_exact_keep_probability_and_the_mean_is_kept():
    torch.manual_seed(0)
    x = torch.full((400, 500), 2.0)
    out = dropout(x, 0.1)
    kept = out != 0
    scale = 1 / (1 - drop_probability(0.1))
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 2.0 * scale))
    assert abs(out.mean().item() - 2.0) < 0.01


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(0)
    x = torch.randn(7, 9, requires_grad=True)
    out = dropout(x, 0.5)
    out.sum().backward()
    expected = (out != 0).float() * 2.0
    torch.testing.assert_close(x.grad, expected)


def test_eval_mode_zero_and_one():
    x = torch.randn(4, 5)
    layer = Dropout(0.3).eval()
    assert layer(x) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    layer.train()
    torch.manual_seed(0)
    assert (layer(torch.ones(1000)) == 0).sum().item() > 200  # drops in training mode
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.5)
    assert repr(Dropout(0.1)) == "Dropout(p=0.1)"


def test_bfloat16_input_keeps_its_dtype():
    torch.manual_seed(0)
    out = dropout(torch.ones(100, dtype=torch.bfloat16), 0.5)
    assert out.dtype == torch.bfloat16
    assert set(out.unique().tolist()) <= {0.0, 2.0}
