"""The label-smoothed loss against PyTorch's cross_entropy and the formula."""

import math

import pytest
import torch
import torch.nn.functional as F

from aiayn.training.loss import label_smoothed_cross_entropy

PAD = 0


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_equals_torch_cross_entropy_with_label_smoothing(epsilon):
    logits = torch.randn(3, 7, 11, dtype=torch.float64)
    target = torch.randint(1, 11, (3, 7))
    target[0, 4:] = PAD
    target[2, 1:] = PAD
    out = label_smoothed_cross_entropy(logits, target, PAD, epsilon)
    reference = F.cross_entropy(
        logits.reshape(-1, 11).float(),
        target.reshape(-1),
        label_smoothing=epsilon,
        ignore_index=PAD,
    )
    assert out.n_tokens == int((target != PAD).sum())
    torch.testing.assert_close(out.loss / out.n_tokens, reference)
    nll = F.cross_entropy(logits.reshape(-1, 11).float(), target.reshape(-1), ignore_index=PAD)
    torch.testing.assert_close(out.nll / out.n_tokens, nll)


def test_pad_positions_do_not_matter_and_bf16_logits_are_accepted():
    logits = torch.randn(2, 5, 9)
    target = torch.tensor([[3, 4, 5, PAD, PAD], [6, 7, 8, 2, PAD]])
    out = label_smoothed_cross_entropy(logits, target, PAD)
    changed = logits.clone()
    changed[0, 3:] = 100.0  # scores at pad positions
    assert label_smoothed_cross_entropy(changed, target, PAD).loss == out.loss
    low = label_smoothed_cross_entropy(logits.bfloat16(), target, PAD)
    assert low.loss.dtype == torch.float32
    assert math.isclose(low.loss.item(), out.loss.item(), rel_tol=2e-2)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_gradients_equal_autograd_through_torch_cross_entropy(epsilon):
    """The hand-written backward against autograd on F.cross_entropy (sum, pad ignored),
    for the loss, the nll, and a mix of both (as a caller weighting them would)."""
    torch.manual_seed(0)
    logits = torch.randn(3, 6, 13, dtype=torch.float64) * 3
    target = torch.randint(1, 13, (3, 6))
    target[1, 2:] = PAD
    flat, ids = logits.reshape(-1, 13), target.reshape(-1)
    for weights in ((1.0, 0.0), (0.0, 1.0), (0.7, -0.4)):
        mine = logits.float().clone().requires_grad_(True)
        out = label_smoothed_cross_entropy(mine, target, PAD, epsilon)
        (weights[0] * out.loss + weights[1] * out.nll).backward()
        ref = flat.float().clone().requires_grad_(True)
        smoothed = F.cross_entropy(
            ref, ids, label_smoothing=epsilon, ignore_index=PAD, reduction="sum"
        )
        nll = F.cross_entropy(ref, ids, ignore_index=PAD, reduction="sum")
        (weights[0] * smoothed + weights[1] * nll).backward()
        torch.testing.assert_close(mine.grad.reshape(-1, 13), ref.grad, rtol=1e-5, atol=1e-6)
        assert mine.grad[1, 2:].abs().max() == 0  # pad positions learn nothing


def test_bf16_logits_get_bf16_gradients_close_to_float32_ones():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 50)
    target = torch.randint(1, 50, (2, 4))
    grads = []
    for dtype in (torch.float32, torch.bfloat16):
        x = logits.to(dtype, copy=True).requires_grad_(True)
        before = x.detach().clone()
        label_smoothed_cross_entropy(x, target, PAD).loss.backward()
        assert x.grad.dtype == dtype
        assert torch.equal(x.detach(), before)  # the backward works on a copy
        grads.append(x.grad.float())
    torch.testing.assert_close(grads[1], grads[0], rtol=2e-2, atol=2e-3)
