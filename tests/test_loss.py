"""The label-smoothed loss against PyTorch's cross_entropy and the formula."""

import math

import pytest
import torch
import torch.nn.functional as F

from aiayn.loss import label_smoothed_cross_entropy

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
