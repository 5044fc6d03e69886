"""The label-smoothed loss against PyTorch's cross_entropy and the formula."""

import math

import pytest
import torch
import torch.nn.functional as F

from aiayn import ModelConfig, Transformer
from aiayn.models.registry import build_model
from aiayn.training import loss as loss_module
from aiayn.training.loss import label_smoothed_cross_entropy, network_loss, projected_cross_entropy

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


# ----- the projection fused with the loss ------------------------------------------------


def _projection_case(seed: int, bias: bool, rows: int = 2 * 256 + 37):
    """States, matrix, bias and targets, pads included."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(1, rows, 24, generator=g, requires_grad=True)
    weight = (torch.randn(90, 24, generator=g) * 0.3).requires_grad_()
    vector = torch.randn(90, generator=g).requires_grad_() if bias else None
    target = torch.randint(1, 90, (1, rows), generator=g)
    target[0, ::7] = 0  # pads
    return hidden, weight, vector, target


@pytest.mark.parametrize("chunk_rows", [100, None])  # several chunks (the last short), one
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_projected_loss_and_gradients_equal_linear_then_torch_cross_entropy(
    bias, epsilon, chunk_rows, monkeypatch
):
    if chunk_rows is not None:
        monkeypatch.setattr(loss_module, "PROBABILITY_BYTES", chunk_rows * 90 * 4)
    hidden, weight, vector, target = _projection_case(0, bias)
    params = [t for t in (hidden, weight, vector) if t is not None]
    logits = F.linear(hidden, weight, vector).view(-1, 90)
    reference = F.cross_entropy(
        logits, target.view(-1), ignore_index=0, label_smoothing=epsilon, reduction="sum"
    )
    nll = F.cross_entropy(logits, target.view(-1), ignore_index=0, reduction="sum")
    expected = torch.autograd.grad(reference, params)

    out = projected_cross_entropy(hidden, weight, vector, target, 0, epsilon)
    got = torch.autograd.grad(out.loss, params)

    assert out.loss.item() == pytest.approx(reference.item(), rel=1e-5)
    assert out.nll.item() == pytest.approx(nll.item(), rel=1e-5)
    assert out.n_tokens.item() == int((target != 0).sum())
    for want, have in zip(expected, got, strict=True):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-5)
    assert got[0][0, ::7].abs().max() == 0  # a pad row gets no gradient


@pytest.mark.parametrize("peaked", [False, True])
def test_projected_loss_under_bf16_autocast_is_close_to_float32(peaked):
    hidden, weight, _, target = _projection_case(1, bias=False)
    if peaked:  # states pointing at their reference rows: p[r] near 0.9, g[r] near 0
        with torch.no_grad():
            rows = weight[target.clamp_min(1)]  # (1, T, D)
            hidden.mul_(0.3).add_(8.0 * rows / rows.norm(dim=-1, keepdim=True))
        probs = F.linear(hidden, weight).softmax(-1).gather(-1, target.unsqueeze(-1))
        assert probs[target != 0].median() > 0.8
    full = projected_cross_entropy(hidden, weight, None, target, 0, 0.1)
    full_grads = torch.autograd.grad(full.loss, [hidden, weight])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = projected_cross_entropy(hidden, weight, None, target, 0, 0.1)
    half_grads = torch.autograd.grad(half.loss, [hidden, weight])
    assert half.loss.dtype == torch.float32
    assert half.loss.item() == pytest.approx(full.loss.item(), rel=1e-2)
    for want, have in zip(full_grads, half_grads, strict=True):
        assert have.dtype == want.dtype == torch.float32
        assert (have - want).norm() < (0.04 if peaked else 0.02) * want.norm()


def test_projected_nll_is_not_differentiable_and_no_grad_skips_the_gradients():
    hidden, weight, _, target = _projection_case(2, bias=False)
    out = projected_cross_entropy(hidden, weight, None, target, 0, 0.1)
    with pytest.raises(RuntimeError, match="only the loss is differentiable"):
        out.nll.backward()
    with torch.no_grad():
        again = projected_cross_entropy(hidden, weight, None, target, 0, 0.1)
    assert again.loss.item() == pytest.approx(out.loss.item(), rel=1e-6)
    assert not again.loss.requires_grad


@pytest.mark.parametrize("shape", ["transformer", "gpt", "bert"])
def test_network_loss_fuses_unless_the_logits_are_hooked_and_both_agree(shape):
    torch.manual_seed(0)
    vocab = 40
    if shape == "transformer":
        model = Transformer(ModelConfig.tiny(vocab_size=vocab))
        inputs = (torch.randint(3, vocab, (3, 6)), torch.randint(3, vocab, (3, 5)))
    else:
        preset = ModelConfig.gpt if shape == "gpt" else ModelConfig.bert
        model = build_model(preset(vocab, d_model=16, n_heads=2, d_ff=32, n_layers=1))
        inputs = (torch.randint(3, vocab, (3, 5)),)
    model.eval()  # no dropout: both passes see the same network
    target = torch.randint(3, vocab, (3, 5))
    target[0, 3:] = model.cfg.pad_id

    calls = []
    model.hook_logits.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    unfused = network_loss(model, inputs, target, model.cfg.pad_id, 0.1)
    unfused_grads = torch.autograd.grad(unfused.loss, list(model.parameters()), allow_unused=True)
    assert calls == [(3, 5, vocab)]  # the hook saw the logits: the plain path ran

    model.hook_logits._forward_hooks.clear()
    fused = network_loss(model, inputs, target, model.cfg.pad_id, 0.1)
    fused_grads = torch.autograd.grad(fused.loss, list(model.parameters()), allow_unused=True)
    assert calls == [(3, 5, vocab)]  # no logits were made
    assert fused.loss.item() == pytest.approx(unfused.loss.item(), rel=1e-5)
    for want, have in zip(unfused_grads, fused_grads, strict=True):
        if want is None:
            assert have is None
        else:
            torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-6)


def test_projected_loss_of_an_all_pad_batch_is_zero_with_zero_gradients():
    hidden, weight, vector, target = _projection_case(3, bias=True, rows=5)
    target[:] = 0
    out = projected_cross_entropy(hidden, weight, vector, target, 0, 0.1)
    grads = torch.autograd.grad(out.loss, [hidden, weight, vector])
    assert out.loss.item() == out.nll.item() == out.n_tokens.item() == 0
    assert all(g.abs().max() == 0 for g in grads)
