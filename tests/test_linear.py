"""aiayn.linear: the CPU inference path computes what nn.Linear computes."""

import torch
import torch.nn.functional as F

from aiayn.linear import Linear


def test_inference_path_equals_f_linear_and_follows_in_place_updates():
    torch.manual_seed(0)
    layer = Linear(6, 5)
    x = torch.randn(2, 3, 6)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    with torch.no_grad():
        layer.weight.mul_(2.0)  # an optimizer step or load_state_dict changes it in place
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        layer.load_state_dict({"weight": torch.ones(5, 6), "bias": torch.zeros(5)})
        torch.testing.assert_close(layer(x), x.sum(-1, keepdim=True).expand(2, 3, 5))


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


def test_frozen_weights_with_an_input_that_needs_gradients():
    layer = Linear(4, 3).requires_grad_(False)
    x = torch.randn(2, 4, requires_grad=True)
    with torch.inference_mode():
        layer(torch.randn(2, 4))  # caches the transposed weight as an inference tensor
    layer(x).sum().backward()
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(2, 4))
