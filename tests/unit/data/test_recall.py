"""The recall and copying generators (aiayn.data.recall): answers, positions, seeds, and a
hand-set two-layer attention that solves MQAR exactly (the task is solvable as drawn)."""

from __future__ import annotations

import pytest
import torch

from aiayn.data.recall import FILLER, IGNORE, MARKER, CopyConfig, MQARConfig, copying, mqar
from aiayn.nn.kernels.sdpa import attend

GRID = [
    MQARConfig(vocab_size=64, seq_len=64, num_pairs=8),
    MQARConfig(vocab_size=130, seq_len=128, num_pairs=32, power_a=1.0),
    MQARConfig(vocab_size=8192, seq_len=256, num_pairs=16),  # Zoology's Figure 2 cell
    MQARConfig(vocab_size=66, seq_len=64, num_pairs=16, random_non_queries=True),
]


@pytest.mark.parametrize("cfg", GRID, ids=lambda c: f"L{c.seq_len}-N{c.num_pairs}")
def test_every_query_is_answered_by_the_value_paired_with_its_key(cfg):
    inputs, targets = mqar(50, cfg, seed=3)
    n, half = cfg.num_pairs, cfg.vocab_size // 2
    assert inputs.shape == targets.shape == (50, cfg.seq_len)
    for row, answers in zip(inputs.tolist(), targets.tolist(), strict=True):
        keys, values = row[0 : 2 * n : 2], row[1 : 2 * n : 2]
        assert len(set(keys)) == n and all(1 <= k < half for k in keys)
        assert len(set(values)) == n and all(half <= v < cfg.vocab_size for v in values)
        table = dict(zip(keys, values, strict=True))
        asked = [(p, row[p], a) for p, a in enumerate(answers) if a != IGNORE]
        assert len(asked) == n  # N queries: every key once
        assert sorted(key for _, key, _ in asked) == sorted(keys)
        for position, key, answer in asked:
            assert position >= 2 * n and (position - 2 * n) % 2 == 0  # at an even offset
            assert answer == table[key]
        if not cfg.random_non_queries:  # everything else after the pairs is filler
            queried = {p for p, _, _ in asked}
            rest = [row[p] for p in range(2 * n, cfg.seq_len) if p not in queried]
            assert set(rest) <= {FILLER}


def test_the_query_gaps_follow_the_power_law_and_power_1_is_uniform():
    """Zoology's a = 0.01 puts most queries soon after the pairs: P(g) ~ (g+1)^-0.99 over
    28 gaps for 4 pairs. Compared with the first query's expected share of gap 0 at
    a = 1 (uniform, 4/28 of the queries), a = 0.01 gives gap 0 to a far larger share."""

    def share_at_gap_zero(power_a):
        cfg = MQARConfig(vocab_size=64, seq_len=64, num_pairs=4, power_a=power_a)
        _, targets = mqar(4000, cfg, seed=0)
        return (targets[:, 8] != IGNORE).float().mean().item()

    assert share_at_gap_zero(1.0) == pytest.approx(4 / 28, abs=0.02)
    # the exact probability that gap 0 is among the 4 drawn, by inclusion over draws:
    # at least its first-draw probability 1 / H, H = sum_g (g+1)^-0.99
    weights = torch.arange(1, 29, dtype=torch.float64) ** -0.99
    assert share_at_gap_zero(0.01) > (weights[0] / weights.sum()).item() + 0.1


def test_seeds_reproduce_and_differ():
    cfg = MQARConfig(vocab_size=64, seq_len=64, num_pairs=8)
    a, b, c = mqar(20, cfg, seed=1), mqar(20, cfg, seed=1), mqar(20, cfg, seed=2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    copy = CopyConfig()
    assert torch.equal(copying(5, copy, 4)[0], copying(5, copy, 4)[0])


@pytest.mark.parametrize(
    "field, value",
    [("seq_len", 63), ("vocab_size", 65), ("num_pairs", 17), ("power_a", 0.0)],
)
def test_bad_settings_are_refused_by_name(field, value):
    settings = dict(vocab_size=66, seq_len=64, num_pairs=8, power_a=0.01)
    with pytest.raises(ValueError, match=f"MQARConfig.{field}"):
        MQARConfig(**{**settings, field: value})


@pytest.mark.parametrize("selective", [True, False])
def test_copying_puts_the_tokens_where_asked_and_asks_for_them_in_order(selective):
    cfg = CopyConfig(vocab_size=10, num_tokens=6, context_len=40, selective=selective)
    inputs, targets = copying(30, cfg, seed=0)
    assert inputs.shape == (30, 46)
    spread = set()
    for row, answers in zip(inputs.tolist(), targets.tolist(), strict=True):
        data = [(p, t) for p, t in enumerate(row[:40]) if t != FILLER]
        assert len(data) == 6 and all(2 <= t < 10 for _, t in data)
        assert row[40:] == [MARKER] * 6
        assert answers[40:] == [t for _, t in data] and set(answers[:40]) == {IGNORE}
        positions = [p for p, _ in data]
        if not selective:
            assert positions == list(range(6))  # then 34 blanks: copied over a distance
        spread.update(positions)
    if selective:
        assert len(spread) > 30  # random positions over the 40


def previous_token_then_match(inputs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Two causal attention layers with set weights (an induction circuit), through
    aiayn's attention function: layer 1 copies each position's previous token
    (positional queries and keys; position 0 has none); layer 2's query is the current
    token, its keys are the previous tokens, its values the tokens: the query for key k lands on the
    position after k, k's value. Returns the (B, L, V) scores of the answer."""
    batch, length = inputs.shape
    sharp = 60.0  # softmax saturates: e^-60 is below float64's care here
    tokens = torch.nn.functional.one_hot(inputs, vocab_size).double()[:, None]  # (B, 1, L, V)
    position = torch.eye(length, dtype=torch.double).expand(batch, 1, length, length)
    before = torch.roll(position, 1, dims=-2)
    before[:, :, 0] = 0  # position 0 has no previous token
    previous, _ = attend(sharp * length**0.5 * before, position, tokens, causal=True)
    # position 0 can only attend itself, so its "previous token" is its own: a bias on
    # one more dimension (a start indicator in the keys, -1 in every query) rules it out
    first = position[..., :1]  # (B, 1, L, 1): 1 at position 0
    queries = torch.cat([tokens, -torch.ones_like(first)], dim=-1)
    keys = torch.cat([previous, first], dim=-1)  # (B, 1, L, V + 1)
    out, _ = attend(sharp * (vocab_size + 1) ** 0.5 * queries, keys, tokens, causal=True)
    return out[:, 0]  # (B, L, V)


@pytest.mark.parametrize("cfg", GRID[:2], ids=lambda c: f"L{c.seq_len}-N{c.num_pairs}")
def test_a_hand_set_two_layer_attention_solves_mqar_exactly(cfg):
    inputs, targets = mqar(16, cfg, seed=7)
    scores = previous_token_then_match(inputs, cfg.vocab_size)
    asked = targets != IGNORE
    assert torch.equal(scores.argmax(-1)[asked], targets[asked])
    # the circuit needs its first layer: with the token itself as key (no previous-token
    # copy), the query finds the key's own position and answers the key, never the value
    tokens = torch.nn.functional.one_hot(inputs, cfg.vocab_size).double()[:, None]
    alone, _ = attend(60.0 * cfg.vocab_size**0.5 * tokens, tokens, tokens, causal=True)
    assert not (alone[:, 0].argmax(-1)[asked] == targets[asked]).any()
