"""An induction circuit built by hand (set weights) scored and ablated with aiayn's tools, and
the composition scores against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn import ModelConfig
from aiayn.analysis.induction import (
    composition_scores,
    copying_scores,
    induction_scores,
    previous_token_scores,
    repeat_losses,
    repeated_random_tokens,
)
from aiayn.models.decoder_only import DecoderOnly
from aiayn.nn.hooks import hooks, run_with_cache

V, T = 8, 6  # tokens 3 .. 7 and 0 are ordinary here; bos is 1
N = 1 + 2 * T  # bos, T tokens, the same T again
GAIN = 30.0  # attention logits and output logits large enough for one-hot attention


def _slot(feature: int) -> int:
    """Feature f lives in the pair of residual dimensions (2f, 2f + 1) as (+x, -x), so every
    residual row has mean zero and each LayerNorm only rescales it."""
    return 2 * feature


def _put(weight: torch.Tensor, row: int, feature: int, value: float) -> None:
    weight[row, _slot(feature)] += value
    weight[row, _slot(feature) + 1] -= value


def induction_circuit() -> DecoderOnly:
    """A 2-layer attention-only GPT, one head per layer, that implements induction exactly.

    Residual features: the token (V), the position (N), the previous token (V, written
    by layer 0), the output (V, written by layer 1). Layer 0's head attends from i to
    i - 1 by position and copies that token into "previous token"; layer 1's head
    attends from a token t to the keys whose previous token is t (K-composition with
    layer 0) and copies the key's token to the output, which the unembedding reads.
    """
    tok, pos = (lambda t: t), (lambda i: V + i)
    prev, out = (lambda t: V + N + t), (lambda t: 2 * V + N + t)
    d_model = 2 * (3 * V + N)
    cfg = ModelConfig.gpt(
        vocab_size=V, d_model=d_model, n_heads=1, d_k=N, d_v=V, d_ff=0, n_layers=2,
        max_len=N, dropout=0.0, attention_dropout=0.0, tie_output=False,
        pad_id=0, bos_id=1, eos_id=2,
    )  # fmt: skip
    model = DecoderOnly(cfg).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        for t in range(V):
            _put(model.decoder.embedding.tokens.weight, t, tok(t), 1.0)
        for i in range(N):
            _put(model.decoder.embedding.positions.weight, i, pos(i), 1.0)
        first, second = (layer.self_attn for layer in model.decoder.layers)
        for i in range(N):  # query i and key i - 1 meet in dimension i
            first.q_proj.weight[i, _slot(pos(i))] = GAIN
            if i + 1 < N:
                first.k_proj.weight[i + 1, _slot(pos(i))] = GAIN
        for t in range(V):
            first.v_proj.weight[t, _slot(tok(t))] = 1.0
            _put(first.out_proj.weight.T, t, prev(t), 1.0)
            second.q_proj.weight[t, _slot(tok(t))] = GAIN
            second.k_proj.weight[t, _slot(prev(t))] = GAIN
            second.v_proj.weight[t, _slot(tok(t))] = 1.0
            _put(second.out_proj.weight.T, t, out(t), 1.0)
            model.output_proj.weight[t, _slot(out(t))] = 5.0
    return model


def repeated(batch: int = 4) -> torch.Tensor:
    """bos, then T distinct ordinary tokens, then the same T (a token repeats only across
    halves, so the token after its earlier occurrence is unique)."""
    generator = torch.Generator().manual_seed(0)
    ordinary = torch.tensor([0, 3, 4, 5, 6, 7])
    rows = [ordinary[torch.randperm(len(ordinary), generator=generator)] for _ in range(batch)]
    tokens = torch.stack(rows)  # (B, T)
    return torch.cat([torch.ones(batch, 1, dtype=torch.long), tokens, tokens], dim=1)


def test_the_hand_built_circuit_scores_as_an_induction_head_and_its_previous_token_head():
    model, ids = induction_circuit(), repeated()
    assert induction_scores(model, ids)[1, 0].item() >= 0.99
    assert copying_scores(model)[1, 0].item() >= 0.99
    assert previous_token_scores(model, ids)[0, 0].item() >= 0.99
    assert induction_scores(model, ids)[0, 0].item() < 0.1  # layer 0 only looks back one


def test_ablating_the_induction_head_or_its_partner_removes_the_in_context_gain():
    model, ids = induction_circuit(), repeated()
    first, repeated_half = repeat_losses(model, ids)
    assert repeated_half < 0.01  # the copy is predicted exactly
    assert first - repeated_half > 1.0
    # without the induction head's output every logit is 0: the uniform loss ln V on
    # both halves, no gain from the context
    assert repeat_losses(model, ids, ablate=[(1, 0)]) == pytest.approx((math.log(V),) * 2)
    # without its previous-token partner its keys are blank: it attends evenly and
    # the repeated half is no longer predicted
    assert repeat_losses(model, ids, ablate=[(0, 0)])[1] - repeated_half > 1.0


def random_gpt() -> DecoderOnly:
    """A 2-layer attention-only pre-norm GPT with random weights, 2 heads per layer."""
    torch.manual_seed(0)
    cfg = ModelConfig.gpt(
        vocab_size=11, d_model=8, n_heads=2, d_ff=0, n_layers=2, max_len=16,
        dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model = DecoderOnly(cfg).eval()
    with torch.no_grad():  # weights of std 1: each head's output moves the loss visibly
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_()
    return model


def _halves(logits: torch.Tensor, ids: torch.Tensor) -> tuple[float, float]:
    """The mean loss on ids 1 .. T and T + 2 .. 2T, from log_softmax by hand."""
    length = (ids.size(1) - 1) // 2
    nll = -logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]  # (B, 2T)
    return nll[:, :length].mean().item(), nll[:, length + 1 :].mean().item()


@pytest.mark.parametrize("layer, head", [(0, 1), (1, 0)])
def test_mean_ablation_equals_the_head_zeroed_and_its_mean_written_through_w_o(layer, head):
    model, specials = random_gpt(), (0, 1, 2)
    ids = repeated_random_tokens(11, 7, 3, seed=0, specials=specials, bos_id=1)  # (3, 15)
    reference = repeated_random_tokens(11, 7, 16, seed=1, specials=specials, bos_id=1)
    attention = model.decoder.layers[layer].self_attn
    z = f"decoder.layers.{layer}.self_attn.hook_z"
    _, cache = run_with_cache(model, reference, names=[z])
    mean = cache[z][:, head].mean(dim=0)  # (T, Dv): per position, over the reference rows
    d_v = attention.d_v
    w_o = attention.out_proj.weight[:, head * d_v : (head + 1) * d_v].T  # (Dv, D)

    def zero(activation, _name):
        activation = activation.clone()
        activation[:, head] = 0.0
        return activation

    def write_mean(x, _name):  # pre-norm: resid_mid = resid_pre + attention output
        return x + mean @ w_o

    with (
        torch.no_grad(),
        hooks(model, {z: zero, f"decoder.layers.{layer}.hook_resid_mid": write_mean}),
    ):
        by_hand = _halves(model(ids), ids)
    ablated = repeat_losses(model, ids, ablate=[(layer, head)], reference=reference)
    assert ablated == pytest.approx(by_hand, abs=1e-5)
    # and it is not zero ablation (the mean output is not zero here)
    zeroed = repeat_losses(model, ids, ablate=[(layer, head)])
    assert max(abs(a - b) for a, b in zip(zeroed, by_hand, strict=True)) > 0.01


def test_mean_ablation_over_the_same_single_row_changes_nothing():
    model = random_gpt()
    ids = repeated_random_tokens(11, 7, 1, seed=0, specials=(0, 1, 2), bos_id=1)
    assert repeat_losses(model, ids, [(1, 0), (0, 1)], reference=ids) == pytest.approx(
        repeat_losses(model, ids), abs=1e-6
    )


def test_mean_ablating_the_hand_built_induction_head_removes_the_in_context_gain():
    model, ids = induction_circuit(), repeated()
    _, repeated_half = repeat_losses(model, ids)
    reference = repeated(batch=16)  # other orders of the same tokens
    _, ablated_repeated = repeat_losses(model, ids, [(1, 0)], reference=reference)
    assert ablated_repeated - repeated_half > 1.0


def test_mean_ablation_refuses_a_reference_of_another_length():
    model = random_gpt()
    ids = repeated_random_tokens(11, 7, 2, seed=0, specials=(0, 1, 2), bos_id=1)
    shorter = repeated_random_tokens(11, 5, 2, seed=1, specials=(0, 1, 2), bos_id=1)
    with pytest.raises(ValueError, match="the mean is per position"):
        repeat_losses(model, ids, [(1, 0)], reference=shorter)


def test_repeat_losses_refuse_a_head_out_of_range():
    with pytest.raises(ValueError, match="head 1 out of range"):
        repeat_losses(induction_circuit(), repeated(), ablate=[(0, 1)])


def test_the_hand_built_pair_composes_through_keys_only():
    composition = composition_scores(induction_circuit())
    assert composition.k[0, 0].item() > 0.2
    assert composition.q[0, 0].item() == 0.0
    assert composition.v[0, 0].item() == 0.0


def two_heads_by_hand() -> DecoderOnly:
    """d_model 2, one head per layer, d_k = d_v = 2, with small integer matrices."""
    cfg = ModelConfig.gpt(
        vocab_size=5, d_model=2, n_heads=1, d_ff=0, n_layers=2, max_len=4,
        dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model = DecoderOnly(cfg)
    first, second = (layer.self_attn for layer in model.decoder.layers)
    with torch.no_grad():  # nn.Linear keeps W^T: the row-vector matrices are the transposes
        first.v_proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]).T)  # W_V
        first.out_proj.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]).T)  # W_O
        second.q_proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]).T)  # W_Q
        second.k_proj.weight.copy_(torch.tensor([[0.0, 1.0], [0.0, 0.0]]).T)  # W_K
        second.v_proj.weight.copy_(torch.tensor([[0.0, 0.0], [0.0, 1.0]]).T)  # W_V
        second.out_proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]).T)  # W_O
    return model


def test_composition_scores_equal_a_hand_computation():
    # A = W_V W_O = [[1, 0], [0, 2]] [[0, 1], [1, 0]] = [[0, 1], [2, 0]]   ||A|| = sqrt(5)
    # B = W_Q W_K^T = I [[0, 0], [1, 0]] = [[0, 0], [1, 0]]               ||B|| = 1
    # C = W_V W_O = [[0, 0], [0, 1]]                                      ||C|| = 1
    # Q: A B = [[1, 0], [0, 0]], norm 1                 -> 1 / sqrt(5)
    # K: B A^T = [[0, 0], [1, 0]] [[0, 2], [1, 0]] = [[0, 0], [0, 2]], norm 2 -> 2 / sqrt(5)
    # V: A C = [[0, 1], [0, 0]], norm 1                 -> 1 / sqrt(5)
    # (the other orders give 2, 1 and 2: A^T B, B A and C A would fail)
    composition = composition_scores(two_heads_by_hand())
    assert composition.q.shape == composition.k.shape == composition.v.shape == (1, 1)
    assert composition.q.item() == pytest.approx(1 / math.sqrt(5), abs=1e-6)
    assert composition.k.item() == pytest.approx(2 / math.sqrt(5), abs=1e-6)
    assert composition.v.item() == pytest.approx(1 / math.sqrt(5), abs=1e-6)


def test_composition_scores_need_an_earlier_and_a_later_layer():
    with pytest.raises(ValueError, match="earlier < later"):
        composition_scores(two_heads_by_hand(), earlier=1, later=0)
