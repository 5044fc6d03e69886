"""Word alignment from cross-attention, attention rollout, IBM Model 1 and AER, by hand."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from aiayn import ModelConfig, Transformer
from aiayn.analysis.alignment import (
    Model1,
    aer,
    attention_matrices,
    best_layer,
    corpus_aer,
    diagonal_alignment,
    rollout,
    word_alignment,
    words,
)
from aiayn.nn.hooks import hooks

# ----- (a) AER --------------------------------------------------------------------------


def test_aer_by_hand_and_at_its_ends():
    reference = {(0, 0), (1, 1), (2, 2), (3, 3)}
    alignment = {(0, 0), (1, 1), (2, 1)}
    # |A ∩ R| = 2, |A| + |R| = 7: 1 - (2 + 2) / 7
    assert aer(alignment, reference) == pytest.approx(3 / 7)
    assert aer(reference, reference) == 0.0
    assert aer({(0, 1), (1, 0)}, reference) == 1.0
    assert aer(set(), set()) == 0.0


def test_the_diagonal_baseline_by_hand():
    # six target words over three source words: each source word takes two in turn
    assert diagonal_alignment(3, 6) == {(0, 0), (0, 1), (1, 2), (1, 3), (2, 4), (2, 5)}
    # equal lengths: the identity; a longer source skips words (centre of each share)
    assert diagonal_alignment(4, 4) == {(i, i) for i in range(4)}
    assert diagonal_alignment(5, 2) == {(1, 0), (3, 1)}
    assert diagonal_alignment(0, 3) == diagonal_alignment(3, 0) == frozenset()


def test_corpus_aer_sums_the_counts_before_dividing():
    # sentence 1: 1 common of 2 + 2; sentence 2: 0 common of 1 + 3 -> 1 - 2 * 1 / 8
    alignments = [{(0, 0), (1, 0)}, {(0, 0)}]
    references = [{(0, 0), (1, 1)}, {(0, 1), (1, 1), (2, 2)}]
    assert corpus_aer(alignments, references) == pytest.approx(1 - 2 / 8)
    assert best_layer([alignments, references], references) == 1


# ----- (b) IBM Model 1 ------------------------------------------------------------------


def test_one_em_iteration_by_hand():
    model = Model1.train([(["a", "b"], ["x", "y"]), (["a"], ["x"])], iterations=1)
    # Each target word shares its count evenly over NULL and the source words:
    # c(x|a) = 1/3 + 1/2, c(y|a) = 1/3; c(x|b) = c(y|b) = 1/3; c(x|NULL) = 1/3 + 1/2.
    table = model.table(["a", "b"], ["x", "y"])  # rows NULL, a, b
    expected = [[5 / 7, 2 / 7], [5 / 7, 2 / 7], [1 / 2, 1 / 2]]
    np.testing.assert_allclose(table, expected)
    unseen = model.table(["a", "unseen"], ["x", "new"])
    np.testing.assert_allclose(unseen, [[5 / 7, 0.0], [5 / 7, 0.0], [0.0, 0.0]])


def test_model1_recovers_a_word_for_word_mapping_from_shuffled_pairs():
    mapping = {"a": "x", "b": "y", "c": "z", "d": "w", "e": "v"}
    rng = random.Random(0)
    pairs, truth = [], []
    for _ in range(60):
        source = rng.sample(sorted(mapping), rng.randint(2, 4))
        order = list(range(len(source)))
        rng.shuffle(order)  # the target in another order
        pairs.append((source, [mapping[source[i]] for i in order]))
        truth.append({(i, j) for j, i in enumerate(order)})
    model = Model1.train(pairs, iterations=5)
    found = [model.align(s, t) for s, t in pairs]
    assert corpus_aer(found, truth) == 0.0


def test_a_target_word_never_seen_stays_unaligned():
    model = Model1.train([(["a", "b"], ["x", "y"]), (["a"], ["x"]), (["b"], ["y"])], 3)
    assert model.align(["a", "b"], ["x", "zzz"]) == {(0, 0)}


def test_model1_refuses_zero_iterations():
    with pytest.raises(ValueError, match="at least 1 EM iteration"):
        Model1.train([(["a"], ["x"])], iterations=0)


# ----- (c) attention alignment, with the weights replaced by hooks --------------------


def test_words_group_pieces_at_word_starts():
    assert words(["▁the", "▁ho", "use", "▁", "."]) == ["the", "house", "."]
    assert words(["ho", "use", "▁x"]) == ["house", "x"]


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.tiny(vocab_size=20, d_model=16, d_ff=32, n_heads=2, dropout=0.0, max_len=16)
    return Transformer(cfg).eval()


SRC_IDS, TGT_IDS = [5, 6, 7, 8], [9, 10, 11]
SRC_PIECES = ["▁the", "▁ho", "use", "▁."]  # words: the, house, .
TGT_PIECES = ["▁das", "▁ha", "us"]  # words: das, haus

# Rows: the queries reading bos, das, ha, us (the last predicts eos);
# columns: ▁the ▁ho use ▁. eos.
CROSS = torch.tensor(
    [
        [0.70, 0.10, 0.05, 0.05, 0.10],  # predicts "das"
        [0.05, 0.30, 0.30, 0.35, 0.00],  # "▁ha": "." is its best piece, "house" its best word
        [0.50, 0.20, 0.20, 0.10, 0.00],  # "us": "the" alone, but the word "haus" sums to house
        [0.10, 0.10, 0.10, 0.10, 0.60],  # predicts eos: dropped
    ]
)
SHIFT = torch.zeros_like(CROSS)
SHIFT[:, 0], SHIFT[:, 3] = 0.05, -0.05  # the heads differ; their mean is CROSS


def replace(weights: torch.Tensor):
    def hook(activation: torch.Tensor, name: str) -> torch.Tensor:
        assert activation.shape == weights.shape, name
        return weights.to(activation.dtype)

    return hook


def test_hooked_cross_attention_gives_the_word_alignment_by_hand(model):
    heads = torch.stack([CROSS + SHIFT, CROSS - SHIFT])[None]  # (1, H, T + 1, S + 1)
    with hooks(model, {"decoder.layers.*.cross_attn.hook_weights": replace(heads)}):
        cross, _ = attention_matrices(model, SRC_IDS, TGT_IDS)
    assert cross.shape == (2, 3, 4)
    torch.testing.assert_close(cross[1], CROSS[:3, :4])
    # das -> the (0.70); haus -> house: 0.60 + 0.40 against the 0.55 of "the", 0.45 of "."
    assert word_alignment(cross[1], SRC_PIECES, TGT_PIECES) == {(0, 0), (1, 1)}
    # piece by piece (every piece its own word) the rows would pick ., the
    single = ["▁" + p.lstrip("▁") for p in TGT_PIECES]
    assert word_alignment(cross[1], [f"▁{i}" for i in range(4)], single) == {
        (0, 0),
        (3, 1),
        (0, 2),
    }


def test_word_alignment_refuses_a_matrix_of_another_shape():
    with pytest.raises(ValueError, match=r"shape \(2, 4\)"):
        word_alignment(torch.zeros(2, 4), SRC_PIECES, TGT_PIECES)


# ----- (d) rollout ----------------------------------------------------------------------


def test_rollout_of_identity_self_attention_is_the_cross_attention():
    cross = CROSS[None]  # one layer
    eye = torch.eye(4)[None]
    torch.testing.assert_close(rollout(eye, cross), CROSS.double())


def test_rollout_of_two_layers_by_hand():
    # Layer 1's self-attention sees no source yet, so it changes nothing. Then
    # R_S = 0.5 C1, R_T = 0.5 Â1; layer 2: R_S = 0.5 Â2 (0.5 C1) + 0.5 C2, rows summing
    # to 0.75: (Â2 C1 + 2 C2) / 3, with Â2 = 0.5 A2 + 0.5 I.
    a1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    a2 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])  # Â2 = [[1, 0], [0.25, 0.75]]
    c1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    c2 = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    expected = torch.tensor([[1 / 3, 2 / 3], [0.25 / 3, 2.75 / 3]], dtype=torch.float64)
    torch.testing.assert_close(rollout(torch.stack([a1, a2]), torch.stack([c1, c2])), expected)
    # identity self-attention: the layers' cross-attention weighted 1 : 2
    eye = torch.eye(2).expand(2, 2, 2)
    torch.testing.assert_close(rollout(eye, torch.stack([c1, c2])), ((c1 + 2 * c2) / 3).double())


def test_hooked_model_rollout_with_identity_self_attention(model):
    uniform = torch.full_like(CROSS, 0.2)  # layer 0's cross-attention; layer 1's is CROSS
    eye = torch.eye(4).expand(1, 2, 4, 4)
    hooked = {
        "decoder.layers.0.cross_attn.hook_weights": replace(uniform.expand(1, 2, 4, 5)),
        "decoder.layers.1.cross_attn.hook_weights": replace(CROSS.expand(1, 2, 4, 5)),
        "decoder.layers.*.self_attn.hook_weights": replace(eye),
    }
    with hooks(model, hooked):
        _, rolled = attention_matrices(model, SRC_IDS, TGT_IDS)
    # 0.25 C_0 + 0.5 C_1 over the full matrices, then bos/eos cut and rows renormalised
    kept = (uniform + 2 * CROSS)[:3, :4]
    torch.testing.assert_close(rolled, kept / kept.sum(-1, keepdim=True))
