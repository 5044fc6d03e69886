"""Token-budget batching: budget, coverage, determinism, resume and shards."""

from __future__ import annotations

import collections
import random

import pytest
import torch

from aiayn.data.batch import Batch
from aiayn.data.batching import TokenBatcher, token_budget_batches

PAD, BOS, EOS = 0, 1, 2


def random_pairs(n: int, seed: int = 0, longest: int = 60) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        s = rng.randint(1, longest)
        t = max(1, min(longest, int(s * rng.uniform(0.6, 1.5))))
        pairs.append(
            ([rng.randint(4, 99) for _ in range(s)], [rng.randint(4, 99) for _ in range(t)])
        )
    return pairs


def as_key(src_row: torch.Tensor, tgt_row: torch.Tensor) -> tuple:
    """A pair recovered from batch rows: real tokens before eos, without specials."""
    src = src_row[src_row != PAD].tolist()
    tgt = tgt_row[tgt_row != PAD].tolist()
    assert src[-1] == EOS and tgt[-1] == EOS
    return tuple(src[:-1]), tuple(tgt[:-1])


def pairs_of(batches) -> collections.Counter:
    return collections.Counter(
        as_key(s, t) for b in batches for s, t in zip(b.src, b.tgt_out, strict=True)
    )


PAIRS = random_pairs(500)


@pytest.mark.parametrize("max_tokens", [61, 200, 1000, 25000])
def test_budget_never_exceeded(max_tokens):
    batcher = TokenBatcher(PAIRS, max_tokens, PAD, BOS, EOS, seed=3)
    for batch in batcher.epoch(0):
        assert batch.src.numel() <= max_tokens
        assert batch.tgt_in.numel() <= max_tokens
        assert batch.tgt_out.numel() <= max_tokens
        assert batch.tgt_in.shape == batch.tgt_out.shape


def test_every_pair_exactly_once_per_epoch():
    batcher = TokenBatcher(PAIRS, 400, PAD, BOS, EOS, seed=1)
    expected = collections.Counter((tuple(s), tuple(t)) for s, t in PAIRS)
    for epoch in (0, 1):
        batches = list(batcher.epoch(epoch))
        assert len(batches) == len(batcher)
        assert pairs_of(batches) == expected


def test_batches_carry_specials_and_counts():
    batcher = TokenBatcher(PAIRS[:50], 300, PAD, BOS, EOS, shuffle=False)
    for batch in batcher.epoch(0):
        assert (batch.tgt_in[:, 0] == BOS).all()
        # tgt_in is tgt_out shifted right by one, bos in front
        real = batch.tgt_out != PAD
        assert torch.equal(batch.tgt_in[:, 1:][real[:, 1:]], batch.tgt_out[:, :-1][real[:, 1:]])
        assert batch.n_src_tokens == int((batch.src != PAD).sum())
        assert batch.n_tgt_tokens == int((batch.tgt_out != PAD).sum())


def test_same_seed_same_batches_other_epoch_other_order():
    first = TokenBatcher(PAIRS, 400, PAD, BOS, EOS, seed=7)
    second = TokenBatcher(list(PAIRS), 400, PAD, BOS, EOS, seed=7)
    assert first.batch_indices(2) == second.batch_indices(2)
    for a, b in zip(first.epoch(2), second.epoch(2), strict=True):
        assert torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
    assert first.batch_indices(2) != first.batch_indices(3)
    other_seed = TokenBatcher(PAIRS, 400, PAD, BOS, EOS, seed=8)
    assert other_seed.batch_indices(2) != first.batch_indices(2)
    # the batches themselves are the same sets; only their order changes
    assert sorted(map(sorted, first.batch_indices(2))) == sorted(
        map(sorted, first.batch_indices(3))
    )


def test_skip_resumes_exactly():
    batcher = TokenBatcher(PAIRS, 400, PAD, BOS, EOS, seed=5)
    full = list(batcher.epoch(4))
    for skip in (0, 1, len(full) // 2, len(full)):
        resumed = list(batcher.epoch(4, skip=skip))
        assert len(resumed) == len(full) - skip
        for a, b in zip(resumed, full[skip:], strict=True):
            assert torch.equal(a.src, b.src) and torch.equal(a.tgt_in, b.tgt_in)
    with pytest.raises(ValueError, match="skip"):
        batcher.epoch(4, skip=len(full) + 1)
    with pytest.raises(ValueError, match="skip"):
        batcher.epoch(4, skip=-1)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_shards_disjoint_complete_and_equal_length(world_size):
    ranks = [
        TokenBatcher(PAIRS, 400, PAD, BOS, EOS, seed=2, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    n_batches = len(ranks[0].batches)
    steps = -(-n_batches // world_size)
    assert {len(r) for r in ranks} == {steps}
    per_rank = [r.batch_indices(6) for r in ranks]
    assert all(len(b) == steps for b in per_rank)
    seen = collections.Counter(i for batches in per_rank for batch in batches for i in batch)
    assert set(seen) == set(range(len(PAIRS)))  # complete
    repeated = steps * world_size - n_batches  # padding batches, documented as repeats
    twice = [i for i, c in seen.items() if c == 2]
    assert all(c <= 2 for c in seen.values())
    batch_sets = [frozenset(b) for batches in per_rank for b in batches]
    assert len(batch_sets) - len(set(batch_sets)) == repeated
    if repeated == 0:
        assert twice == []  # disjoint
    # all ranks together equal the single-process epoch, plus the repeats
    single = TokenBatcher(PAIRS, 400, PAD, BOS, EOS, seed=2)
    assert set(map(frozenset, single.batch_indices(6))) == set(batch_sets)


def test_shards_disjoint_when_divisible():
    pairs = [([5] * 9, [6] * 9)] * 40  # 10 tokens a side: 4 per batch of 40 -> 10 batches
    ranks = [TokenBatcher(pairs, 40, PAD, BOS, EOS, rank=r, world_size=2) for r in range(2)]
    a, b = (set(i for batch in r.batch_indices(0) for i in batch) for r in ranks)
    assert len(ranks[0].batches) == 10 and len(ranks[0]) == len(ranks[1]) == 5
    assert a.isdisjoint(b) and a | b == set(range(40))


def test_pair_over_budget_raises():
    pairs = [([5] * 10, [6] * 3), ([5] * 3, [6] * 50)]
    with pytest.raises(ValueError, match=r"pair 1 .* 4 source and 51 target tokens"):
        TokenBatcher(pairs, 50, PAD, BOS, EOS)
    TokenBatcher(pairs, 51, PAD, BOS, EOS)  # exactly at the budget is fine


def test_bad_arguments():
    with pytest.raises(ValueError, match="rank"):
        TokenBatcher(PAIRS, 400, PAD, BOS, EOS, rank=2, world_size=2)
    with pytest.raises(ValueError, match="at least one pair"):
        TokenBatcher([], 400, PAD, BOS, EOS)


def test_greedy_cut_reference():
    # (source, target) lengths with specials; sorted by (longer side, source, target):
    # 1 (2, 2), 3 (1, 3), 2 (3, 1), 0 (5, 2), 4 (8, 4)
    lengths = [(5, 2), (2, 2), (3, 1), (1, 3), (8, 4)]
    # budget 9: [1] 1*2; +3 2*3=6; +2 3*3=9; +0 4*5=20 > 9: cut; [0] 5; +4 2*8 > 9: cut
    assert token_budget_batches(lengths, 9) == [[1, 3, 2], [0], [4]]


def test_padding_fraction_matches_the_tensors():
    batcher = TokenBatcher(PAIRS, 600, PAD, BOS, EOS, seed=0)
    pad = total = 0
    for batch in batcher.epoch(0):
        for t in (batch.src, batch.tgt_out):
            pad += int((t == PAD).sum())
            total += t.numel()
    assert batcher.padding_fraction() == pytest.approx(pad / total)
    # length-sorted buckets pad far less than the same greedy cut in random order
    order = list(range(len(PAIRS)))
    random.Random(0).shuffle(order)
    real = padded = 0
    current: list[int] = []
    for i in [*order, None]:
        grown = [*current, i] if i is not None else current
        longest = max(max(len(PAIRS[j][0]), len(PAIRS[j][1])) + 1 for j in grown)
        if i is None or len(grown) * longest > 600:
            src = [len(PAIRS[j][0]) + 1 for j in current]
            tgt = [len(PAIRS[j][1]) + 1 for j in current]
            real += sum(src) + sum(tgt)
            padded += len(current) * (max(src) + max(tgt))
            current = [i]
        else:
            current = grown
    assert batcher.padding_fraction() < 0.5 * (1 - real / padded)


def test_batch_from_pairs_reference():
    batch = Batch.from_pairs([([7, 8], [9]), ([7], [9, 9, 9])], PAD, BOS, EOS)
    assert batch.src.tolist() == [[7, 8, EOS], [7, EOS, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 9, PAD, PAD], [BOS, 9, 9, 9]]
    assert batch.tgt_out.tolist() == [[9, EOS, PAD, PAD], [9, 9, 9, EOS]]
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (5, 6)


def test_length_multiple_pads_to_the_multiple_within_the_budget():
    plain = TokenBatcher(PAIRS, 600, PAD, BOS, EOS, seed=2)
    rounded = TokenBatcher(PAIRS, 600, PAD, BOS, EOS, seed=2, length_multiple=8)
    batches = list(rounded.epoch(0))
    for batch in batches:
        assert batch.src.size(1) % 8 == 0 and batch.tgt_out.size(1) % 8 == 0
        assert batch.src.numel() <= 600 and batch.tgt_out.numel() <= 600
        # the rounding adds at most 7 pad columns to a side
        longest_src = int((batch.src != PAD).sum(1).max())
        longest_tgt = int((batch.tgt_out != PAD).sum(1).max())
        assert batch.src.size(1) - longest_src < 8 and batch.tgt_out.size(1) - longest_tgt < 8
    # same pairs, the same counts, fewer distinct shapes, more padding
    assert pairs_of(batches) == pairs_of(plain.epoch(0))
    assert sum(b.n_tgt_tokens for b in batches) == sum(b.n_tgt_tokens for b in plain.epoch(0))

    def shapes(batcher):
        return {(b.size, b.src.size(1), b.tgt_out.size(1)) for b in batcher.epoch(0)}

    assert len(shapes(rounded)) < len(shapes(plain))
    pad = sum(int((t == PAD).sum()) for b in batches for t in (b.src, b.tgt_out))
    total = sum(t.numel() for b in batches for t in (b.src, b.tgt_out))
    assert rounded.padding_fraction() == pytest.approx(pad / total)
    assert rounded.padding_fraction() > plain.padding_fraction()


def test_length_multiple_greedy_cut_reference():
    # lengths (5, 2), (2, 2), (3, 1), (1, 3), (8, 4) round up to multiples of 4:
    # (8, 4), (4, 4), (4, 4), (4, 4), (8, 4); within a rounded length the exact lengths
    # order them (longer side, source, target): 1 (2, 2), 3 (1, 3), 2 (3, 1), then 0, 4
    lengths = [(5, 2), (2, 2), (3, 1), (1, 3), (8, 4)]
    # budget 9: [1] 4; +3 2*4=8; +2 3*4 > 9: cut; [2] 4; +0 2*8 > 9: cut; [0]; [4]
    assert token_budget_batches(lengths, 9, length_multiple=4) == [[1, 3], [2], [0], [4]]
    # a pair that fits the budget only before rounding is refused, naming the multiple
    with pytest.raises(ValueError, match=r"pair 0 .* 8 source .* multiple of 4"):
        token_budget_batches([(7, 3)], 7, length_multiple=4)
    with pytest.raises(ValueError, match="length_multiple"):
        token_budget_batches(lengths, 9, length_multiple=0)


def test_batch_from_pairs_length_multiple_reference():
    batch = Batch.from_pairs([([7, 8], [9]), ([7], [9, 9, 9])], PAD, BOS, EOS, length_multiple=3)
    assert batch.src.tolist() == [[7, 8, EOS], [7, EOS, PAD]]  # 3 is already a multiple
    assert batch.tgt_in.tolist() == [[BOS, 9, PAD, PAD, PAD, PAD], [BOS, 9, 9, 9, PAD, PAD]]
    assert batch.tgt_out.tolist() == [[9, EOS, PAD, PAD, PAD, PAD], [9, 9, 9, EOS, PAD, PAD]]
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (5, 6)
