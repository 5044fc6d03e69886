"""aiayn.linear: the CPU inference paths compute what nn.Linear computes."""

import pytest
import torch
import torch.nn.functional as F

import aiayn.linear
from aiayn.attention import MultiHeadAttention
from aiayn.linear import Linear, refresh_inference_weights

# Both inference paths: the transposed weight (small weights) and oneDNN's packed
# weight (every weight, with the threshold at 0; skipped where oneDNN is missing).
PATHS = [
    pytest.param(None, id="transposed"),
    pytest.param(
        0,
        id="packed",
        marks=pytest.mark.skipif(not aiayn.linear._ONEDNN, reason="PyTorch built without oneDNN"),
    ),
]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    if request.param is not None:
        monkeypatch.setattr(aiayn.linear, "PACK_MIN_ELEMENTS", request.param)
        monkeypatch.setattr(aiayn.linear, "PACK_MIN_ROWS", request.param)
    return request.param


def test_inference_path_equals_f_linear_and_follows_in_place_updates(path):
    torch.manual_seed(0)
    layer = Linear(6, 5)
    x = torch.randn(2, 3, 6)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        torch.testing.assert_close(
            layer(x, relu=True), F.relu(F.linear(x, layer.weight, layer.bias))
        )
    packed = layer._fast_weight.packed._value
    assert (packed is not None) == (path == 0)  # the path under test ran
    with torch.no_grad():
        layer.weight.mul_(2.0)  # an optimizer step or load_state_dict changes it in place
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        layer.load_state_dict({"weight": torch.ones(5, 6), "bias": torch.zeros(5)})
        torch.testing.assert_close(layer(x), x.sum(-1, keepdim=True).expand(2, 3, 5))


@pytest.mark.parametrize("fused", [True, False])
def test_inference_after_an_optimizer_step_uses_the_new_weights(path, fused):
    """Fused optimizers leave version counters alone; the step hook catches them."""
    torch.manual_seed(0)
    layer = Linear(6, 5)
    optimizer = torch.optim.Adam(layer.parameters(), lr=0.1, fused=fused)
    x = torch.randn(3, 6)
    for _ in range(3):
        with torch.inference_mode():
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        layer(torch.randn(4, 6)).square().sum().backward()
        optimizer.step()
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_refresh_after_changes_through_data():
    layer = Linear(6, 5)
    x = torch.randn(3, 6)
    with torch.inference_mode():
        layer(x)
    layer.weight.data.mul_(3.0)  # .data: no version bump
    refresh_inference_weights()
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_inference_path_without_bias_on_a_non_contiguous_input(path):
    torch.manual_seed(0)
    layer = Linear(8, 7, bias=False)
    x = torch.randn(4, 16)[:, ::2]  # strided rows
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight))


def test_bfloat16_inference_path_matches_f_linear_in_bfloat16(path):
    torch.manual_seed(0)
    layer = Linear(64, 48).to(torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        out = layer(x, relu=True)
    assert out.dtype == torch.bfloat16
    expected = F.relu(F.linear(x.float(), layer.weight.float(), layer.bias.float()))
    torch.testing.assert_close(out.float(), expected, atol=0.05, rtol=0.02)


def test_fused_qkv_projection_equals_the_three_projections(path):
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=16, n_heads=4, n_kv_heads=2, d_k=4, d_v=6)
    x = torch.randn(3, 5, 16)
    with torch.inference_mode():
        fused = attn._project_qkv(x)
    separate = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], dim=-1)
    torch.testing.assert_close(fused, separate.detach())


def test_float64_and_training_take_f_linear():
    layer = Linear(4, 3).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert layer._fast_weight.transposed._value is None  # nothing laid out for float64
    assert layer._fast_weight.packed._value is None


def test_training_path_gives_the_gradients_of_nn_linear():
    torch.manual_seed(0)
    layer = Linear(4, 3, bias=False)
    x = torch.randn(5, 4, requires_grad=True)
    layer(x).square().sum().backward()
    expected_x, expected_w = torch.autograd.grad(
        F.linear(x, layer.weight).square().sum(), [x, layer.weight]
    )
    torch.testing.assert_close(x.grad, expected_x)
    torch.testing.assert_close(layer.weight.grad, expected_w)


def test_frozen_weights_with_an_input_that_needs_gradients(path):
    layer = Linear(4, 3).requires_grad_(False)
    x = torch.randn(2, 4, requires_grad=True)
    with torch.inference_mode():
        layer(torch.randn(2, 4))  # lays out the weight as an inference tensor
    layer(x).sum().backward()
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(2, 4))


@pytest.mark.skipif(not aiayn.linear._ONEDNN, reason="PyTorch built without oneDNN")
def test_a_large_weight_is_packed_for_many_rows_and_transposed_for_few(monkeypatch):
    monkeypatch.setattr(aiayn.linear, "PACK_MIN_ELEMENTS", 30)
    torch.manual_seed(0)
    layer = Linear(6, 5)  # 30 elements: large, under the patched threshold
    few, many = torch.randn(2, 6), torch.randn(aiayn.linear.PACK_MIN_ROWS, 6)
    with torch.inference_mode():
        torch.testing.assert_close(layer(few), F.linear(few, layer.weight, layer.bias))
        assert layer._fast_weight.packed._value is None
        torch.testing.assert_close(layer(many), F.linear(many, layer.weight, layer.bias))
        assert layer._fast_weight.packed._value is not None
        transposed = layer._fast_weight.transposed._value
        layer(few)  # both layouts are kept: alternating row counts rebuild nothing
        assert layer._fast_weight.transposed._value is transposed
