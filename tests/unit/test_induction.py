"""Induction-head scores against hand computations: forced and uniform attention, the
attention of layer 0 computed with plain torch, and OV circuits built by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from aiayn import ModelConfig
from aiayn.analysis.induction import (
    copying_scores,
    induction_scores,
    previous_token_scores,
    repeated_random_tokens,
)
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import Transformer
from aiayn.models.encoder_only import EncoderOnly
from aiayn.nn.hooks import hooks, run_with_cache

VOCAB, T = 40, 6
SPECIALS = (0, 1, 2, 3)
SHAPE = {"d_model": 32, "n_heads": 4, "d_ff": 64, "max_len": 24, "n_layers": 2, "dropout": 0.0}


def gpt(**overrides) -> DecoderOnly:
    torch.manual_seed(0)
    return DecoderOnly(ModelConfig.gpt(vocab_size=VOCAB, **{**SHAPE, **overrides})).eval()


def sequences(batch: int = 3, seed: int = 0) -> torch.Tensor:
    return repeated_random_tokens(VOCAB, T, batch, seed, SPECIALS, bos_id=1)


# ----- the sequences ----------------------------------------------------------------


def test_repeated_random_tokens_are_bos_then_one_repeat_twice_without_specials():
    ids = repeated_random_tokens(VOCAB, T, 5, 7, SPECIALS, bos_id=1)
    assert ids.shape == (5, 1 + 2 * T) and ids.dtype == torch.long
    assert ids[:, 0].tolist() == [1] * 5
    assert torch.equal(ids[:, 1 : 1 + T], ids[:, 1 + T :])
    body = ids[:, 1:]
    assert not torch.isin(body, torch.tensor(SPECIALS)).any()
    assert int(body.min()) >= 0 and int(body.max()) < VOCAB
    assert torch.equal(ids, repeated_random_tokens(VOCAB, T, 5, 7, SPECIALS, bos_id=1))
    assert not torch.equal(ids, repeated_random_tokens(VOCAB, T, 5, 8, SPECIALS, bos_id=1))
    # every ordinary token can be drawn: with 2 ordinary ids both show up
    few = repeated_random_tokens(6, 50, 2, 0, SPECIALS, bos_id=1)[:, 1:]
    assert set(few.unique().tolist()) == {4, 5}


def test_repeated_random_tokens_refuse_an_all_special_vocabulary_and_empty_sizes():
    with pytest.raises(ValueError, match="only special"):
        repeated_random_tokens(4, T, 1, 0, SPECIALS, bos_id=1)
    with pytest.raises(ValueError, match="at least 1"):
        repeated_random_tokens(VOCAB, 0, 1, 0, SPECIALS, bos_id=1)


# ----- prefix matching and previous token -----------------------------------------


def forced(weights: torch.Tensor, head: int, target: callable) -> torch.Tensor:
    """`weights` (B, H, Q, K) with head `head` attending only to key target(q)."""
    weights = weights.clone()
    weights[:, head] = 0.0
    for q in range(weights.size(2)):
        weights[:, head, q, target(q)] = 1.0
    return weights


def test_a_head_forced_onto_the_token_after_the_earlier_occurrence_scores_exactly_one():
    model, ids = gpt(), sequences()
    # i - T + 1 on the second repeat (i >= T + 1); bos before it (a causal row sums to 1)
    induction = lambda q: q - T + 1 if q >= T + 1 else 0  # noqa: E731
    previous = lambda q: max(q - 1, 0)  # noqa: E731
    patches = {
        "decoder.layers.1.self_attn.hook_weights": lambda w, _: forced(w, 2, induction),
        "decoder.layers.0.self_attn.hook_weights": lambda w, _: forced(w, 3, previous),
    }
    with hooks(model, patches):
        matching = induction_scores(model, ids)
        prev = previous_token_scores(model, ids)
    assert matching[1, 2].item() == 1.0 and prev[0, 3].item() == 1.0
    assert matching.shape == prev.shape == (2, 4)
    others = torch.ones_like(matching, dtype=torch.bool)
    others[1, 2] = False
    assert (matching[others] < 1.0).all()
    # the previous-token head attends to i - 1 = i - T + 1 only when T = 2: not here
    assert matching[0, 3].item() == 0.0
    # the induction head attends to i - 1 only at i = 1 (onto bos), one position in 2T
    assert prev[1, 2].item() == pytest.approx(1 / (2 * T))


def test_uniform_attention_scores_the_mean_of_one_over_the_visible_keys():
    model, ids = gpt(), sequences()

    def uniform(weights: torch.Tensor, _name: str) -> torch.Tensor:
        q = torch.arange(weights.size(2))
        visible = (q[None, :] <= q[:, None]).float()  # (Q, K): causal
        return (visible / visible.sum(-1, keepdim=True)).expand_as(weights).clone()

    with hooks(model, {"decoder.layers.*.self_attn.hook_weights": uniform}):
        matching = induction_scores(model, ids)
        prev = previous_token_scores(model, ids)
    # query i sees keys 0..i: i + 1 of them
    expected_matching = sum(1 / (i + 1) for i in range(T + 1, 2 * T + 1)) / T
    expected_prev = sum(1 / (i + 1) for i in range(1, 2 * T + 1)) / (2 * T)
    torch.testing.assert_close(matching, torch.full((2, 4), expected_matching))
    torch.testing.assert_close(prev, torch.full((2, 4), expected_prev))


def test_layer_zero_scores_equal_a_loop_over_attention_computed_by_hand():
    model, ids = gpt(n_kv_heads=2), sequences()
    with torch.no_grad():
        _, cache = run_with_cache(model, ids, names="decoder.layers.0.hook_resid_pre")
        layer = model.decoder.layers[0]
        x = layer.self_residual.norm(cache["decoder.layers.0.hook_resid_pre"])  # pre-norm
        attention = layer.self_attn
        batch, length, _ = x.shape
        q = F.linear(x, attention.q_proj.weight, attention.q_proj.bias).view(batch, length, 4, 8)
        k = F.linear(x, attention.k_proj.weight, attention.k_proj.bias).view(batch, length, 2, 8)
        k = k.repeat_interleave(2, dim=2)  # query heads 0, 1 read key head 0; 2, 3 read 1
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / 8**0.5
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)  # (B, H, Q, K)
    expected_matching = torch.zeros(4)
    expected_prev = torch.zeros(4)
    for b in range(batch):
        for i in range(T + 1, 2 * T + 1):
            expected_matching += weights[b, :, i, i - T + 1] / (batch * T)
        for i in range(1, 2 * T + 1):
            expected_prev += weights[b, :, i, i - 1] / (batch * 2 * T)
    torch.testing.assert_close(induction_scores(model, ids)[0], expected_matching)
    torch.testing.assert_close(previous_token_scores(model, ids)[0], expected_prev)


def test_scores_run_in_eval_mode_and_leave_the_mode_as_it_was():
    model, ids = gpt(dropout=0.5, attention_dropout=0.5), sequences()
    expected = induction_scores(model, ids)
    model.train()
    torch.testing.assert_close(induction_scores(model, ids), expected)
    assert model.training


def test_other_shapes_and_sequences_that_do_not_repeat_are_refused():
    shape = {k: v for k, v in SHAPE.items() if k != "n_layers"}
    translation = Transformer(ModelConfig.tiny(vocab_size=VOCAB, **shape))
    bert = EncoderOnly(ModelConfig.bert(vocab_size=VOCAB, **SHAPE))
    for model, name in ((translation, "encoder_decoder"), (bert, "encoder_only")):
        for score in (induction_scores, previous_token_scores):
            with pytest.raises(ValueError, match=f"a {name} model"):
                score(model, sequences())
        with pytest.raises(ValueError, match=f"a {name} model"):
            copying_scores(model)
    ids = sequences()
    ids[0, -1] = (ids[0, -1] + 1) % VOCAB
    with pytest.raises(ValueError, match="must repeat"):
        induction_scores(gpt(), ids)
    with pytest.raises(ValueError, match=r"\(B, 1 \+ 2T\)"):
        induction_scores(gpt(), sequences()[:, :-1])


# ----- copying ----------------------------------------------------------------------


def identity_head(sign: float) -> DecoderOnly:
    """Head 1 of layer 0 has W_V W_O = sign * I (Dv = D), the output tied to the embedding."""
    model = gpt(d_v=32, tie_output=True)
    attention = model.decoder.layers[0].self_attn
    with torch.no_grad():
        attention.v_proj.weight[32:64] = torch.eye(32)  # head 1's rows: W_V^T
        attention.out_proj.weight[:, 32:64] = sign * torch.eye(32)  # its columns: W_O^T
    return model


@pytest.mark.parametrize("sign, expected", [(1.0, 1.0), (-1.0, -1.0)])
def test_a_head_whose_ov_circuit_is_plus_or_minus_the_identity_copies_or_suppresses(sign, expected):
    scores = copying_scores(identity_head(sign))
    assert scores.shape == (2, 4)
    assert scores[0, 1].item() == pytest.approx(expected, abs=1e-9)
    others = torch.ones_like(scores, dtype=torch.bool)
    others[0, 1] = False
    assert (scores[others].abs() < 0.99).all()  # random heads: far from either end


def full_circuit_score(model: DecoderOnly, layer: int, head: int) -> float:
    """The V x V circuit W_E W_V W_O W_U with plain torch, scored with numpy's eigenvalues."""
    attention = model.decoder.layers[layer].self_attn
    d_v, group = attention.d_v, attention.n_heads // attention.n_kv_heads
    kv = head // group
    w_e = model.decoder.embedding.tokens.weight.double()  # (V, D)
    w_v = attention.v_proj.weight[kv * d_v : (kv + 1) * d_v].double().T  # (D, Dv)
    w_o = attention.out_proj.weight[:, head * d_v : (head + 1) * d_v].double().T  # (Dv, D)
    w_u = (
        w_e.T if model.output_proj is None else model.output_proj.weight.double().T  # (D, V)
    )
    circuit = (w_e @ w_v @ w_o @ w_u).detach().numpy()  # (V, V)
    eigenvalues = np.linalg.eigvals(circuit)
    return float(eigenvalues.real.sum() / np.abs(eigenvalues).sum())


@pytest.mark.parametrize(
    "overrides",
    [{}, {"n_kv_heads": 2}, {"tie_output": False}],
    ids=["tied", "grouped-query", "untied output"],
)
def test_the_small_cyclic_matrix_agrees_with_the_full_vocabulary_circuit(overrides):
    model = gpt(**overrides)
    with torch.no_grad():  # away from initialisation, so that the scores spread out
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    scores = copying_scores(model)
    expected = torch.tensor(
        [[full_circuit_score(model, layer, head) for head in range(4)] for layer in range(2)],
        dtype=torch.float32,
    )
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-5)
    assert scores.abs().max() < 1.0 and scores.std() > 0.01  # not a constant


def test_a_prefix_lm_whose_prefix_is_bos_alone_scores_as_the_same_weights_in_gpt():
    from aiayn.models.prefix_lm import PrefixLM

    model = gpt()
    prefix_lm = PrefixLM(ModelConfig.gpt(vocab_size=VOCAB, architecture="prefix_lm", **SHAPE))
    prefix_lm.load_state_dict(model.state_dict())
    ids = sequences()
    torch.testing.assert_close(induction_scores(prefix_lm, ids), induction_scores(model, ids))
    torch.testing.assert_close(
        previous_token_scores(prefix_lm, ids), previous_token_scores(model, ids)
    )


def test_a_pruned_layer_scores_its_remaining_heads_and_nan_past_them():
    from aiayn.analysis.pruning import prune_heads

    model, ids = gpt(), sequences()
    pruned = prune_heads(model, {"decoder.0.self": [1]}).eval()  # layer 0 keeps heads 0, 2, 3
    for score in (lambda m: induction_scores(m, ids), copying_scores):
        full, less = score(model), score(pruned)
        assert less.shape == (2, 4) and less[0, 3].isnan() and not less[1].isnan().any()
        # heads whose attention and OV circuit do not change (layer 0's) keep their scores
        torch.testing.assert_close(less[0, :3], full[0, [0, 2, 3]])


def test_write_induction_keeps_a_missing_head_as_null(tmp_path):
    import json

    from aiayn.analysis.induction import InductionScores, write_induction

    grid = torch.tensor([[0.5, 0.25], [0.75, float("nan")]])
    scores = InductionScores(grid, grid / 2, -grid)
    paths = write_induction(scores, tmp_path, run="r")
    assert [p.name for p in paths] == [
        "induction.png", "previous-token.png", "copying.png", "induction.json",
    ]  # fmt: skip
    data = json.loads((tmp_path / "induction.json").read_text())
    assert data["run"] == "r" and data["induction"] == [[0.5, 0.25], [0.75, None]]
    assert data["copying"] == [[-0.5, -0.25], [-0.75, None]]
    assert scores.top_heads(5) == [(1, 0), (0, 0), (0, 1)]  # the NaN head is never a top head
