"""Search: greedy, beam (section 6), sampling, against formulas and exhaustive search."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import Tensor

import aiayn.inference.search
from aiayn import ModelConfig, Transformer
from aiayn.inference.search import (
    DecodeConfig,
    EarlyStopping,
    LengthPenalty,
    TokenRules,
    beam_search,
    filter_logits,
    greedy_search,
    length_penalty,
    max_output_lengths,
    sample,
    search,
    top_candidates,
)

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4
NEVER = float("-inf")


def _peaky_model(vocab_size: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> Transformer:
    """A random tiny model whose next-token distributions are far from uniform."""
    torch.manual_seed(seed)
    cfg = ModelConfig.tiny(
        vocab_size=vocab_size, d_model=32, n_heads=4, d_ff=64, dropout=0.0, tie_output=False
    )
    model = Transformer(cfg).eval()
    with torch.no_grad():  # untied, so that peaky outputs do not just repeat the input token
        model.output_proj.weight.normal_(std=0.6)
    return model.to(dtype)


def _src(rows: list[list[int]]) -> Tensor:
    """Pad id lists (each ending in eos) into a (B, S) tensor."""
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


class TableModel:
    """A fake model with hand-written next-token probabilities, for hand-computed cases.

    `table` maps a prefix (tuple of generated ids) to {token: probability}; tokens
    missing have probability 0; `by_source` overrides the table for sentences
    whose first source token is its key. Its `TableDecoding` keeps each row's
    prefix and each sentence's source in the order the search's `keep` says, so
    the search's reordering is exercised as well. `steps` counts decoder calls.
    """

    def __init__(
        self,
        table: dict[tuple[int, ...], dict[int, float]],
        by_source: dict[int, dict[tuple[int, ...], dict[int, float]]] | None = None,
    ) -> None:
        self.cfg = ModelConfig.tiny(vocab_size=5)
        self.table, self.by_source = table, by_source or {}
        self.steps = 0

    def start(self, src: Tensor, beam: int = 1) -> TableDecoding:
        return TableDecoding(self, src, beam)


class TableDecoding:
    def __init__(self, model: TableModel, src: Tensor, beam: int) -> None:
        self.model, self.beam = model, beam
        self.input_lengths = (src != model.cfg.pad_id).sum(dim=1)
        self.dtype = torch.float64
        self.sources = src[:, 0].tolist()  # per live sentence
        self.prefixes = torch.empty(src.size(0) * beam, 0, dtype=torch.long)  # per row

    def step(self, last: Tensor) -> Tensor:
        self.model.steps += 1
        self.prefixes = torch.cat([self.prefixes, last[:, None]], dim=1)
        logits = torch.full((last.size(0), self.model.cfg.vocab_size), NEVER, dtype=torch.float64)
        for row, prefix in enumerate(self.prefixes.tolist()):
            table = self.model.by_source.get(self.sources[row // self.beam], self.model.table)
            for token, p in table.get(tuple(prefix[1:]), {EOS: 1.0}).items():
                logits[row, token] = math.log(p)
        return logits

    def keep(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        self.prefixes = self.prefixes[rows]
        if sentences is not None:
            self.sources = [self.sources[i] for i in sentences.tolist()]


# ----- the length penalty and the length limit ---------------------------------


def test_length_penalty_is_gnmt_formula() -> None:
    assert length_penalty(1, 0.6) == pytest.approx(1.0)  # (5 + 1) / 6 = 1
    assert length_penalty(7, 0.6) == pytest.approx(2**0.6)  # (5 + 7) / 6 = 2
    assert length_penalty(13, 1.0) == pytest.approx(3.0)
    assert length_penalty(40, 0.0) == 1.0
    lengths = torch.tensor([1.0, 7.0, 13.0])
    assert torch.allclose(length_penalty(lengths, 1.0), torch.tensor([1.0, 2.0, 3.0]))


def test_max_output_length_is_source_plus_extra_clipped() -> None:
    real = torch.tensor([[True, True, False], [True, True, True]])
    assert max_output_lengths(real, 50, 1024).tolist() == [52, 53]
    assert max_output_lengths(real, 50, 52).tolist() == [52, 52]


def test_length_penalty_hf_form_is_length_to_the_alpha() -> None:
    assert length_penalty(4, 0.5, LengthPenalty.HF) == pytest.approx(2.0)
    assert length_penalty(9, 1.0, LengthPenalty.HF) == pytest.approx(9.0)
    assert length_penalty(9, 0.0, LengthPenalty.HF) == 1.0


def test_absolute_max_output_length() -> None:
    real = torch.tensor([[True, True, False], [True, True, True]])
    assert max_output_lengths(real, None, 1024, 7).tolist() == [7, 7]
    assert max_output_lengths(real, 50, 1024, 7).tolist() == [7, 7]
    assert max_output_lengths(real, 1, 1024, 7).tolist() == [3, 4]
    assert max_output_lengths(real, None, 5).tolist() == [5, 5]


def test_banned_tokens_forced_eos_and_renormalisation() -> None:
    model = TableModel(
        {(A,) * n + (B,) * m: {A: 0.6, B: 0.3, EOS: 0.1} for n in range(4) for m in range(4)}
    )
    src = _src([[A, EOS]])
    (best,) = greedy_search(model, src, None, max_output_len=3)[0]
    assert best.tokens == [A, A] and best.log_prob == pytest.approx(
        2 * math.log(0.6) + math.log(0.1)
    )
    banned = TokenRules(banned_ids=(A,))
    (best,) = greedy_search(model, src, None, max_output_len=3, rules=banned)[0]
    assert best.tokens == [B, B] and best.log_prob == pytest.approx(
        2 * math.log(0.3) + math.log(0.1)
    )
    free = TokenRules(banned_ids=(A,), free_forced_eos=True)
    (best,) = greedy_search(model, src, None, max_output_len=3, rules=free)[0]
    assert best.log_prob == pytest.approx(2 * math.log(0.3))  # the forced eos costs nothing
    renormalized = TokenRules(banned_ids=(A,), renormalize=True)
    (best,) = greedy_search(model, src, None, max_output_len=3, rules=renormalized)[0]
    assert best.tokens == [B, B]
    assert best.log_prob == pytest.approx(2 * math.log(0.3 / 0.4))  # eos alone: log 1


def test_output_never_exceeds_the_limit() -> None:
    never_ends = {(): {A: 0.9, EOS: 0.1}, (A,): {A: 0.9, EOS: 0.1}, (A, A): {A: 0.9, EOS: 0.1}}
    never_ends.update({(A,) * n: {A: 0.9, EOS: 0.1} for n in range(3, 10)})
    model = TableModel(never_ends)
    src = _src([[A, EOS]])  # 2 source tokens + extra 3 = 5 output tokens, eos included
    (best,) = greedy_search(model, src, extra_len=3)[0]
    assert best.tokens == [A] * 4
    assert best.log_prob == pytest.approx(4 * math.log(0.9) + math.log(0.1))
    (best,) = beam_search(model, src, beam=2, alpha=0.0, extra_len=3)[0]
    assert len(best.tokens) <= 4


# ----- hand-computed beam search cases ---------------------------------------------

# Step 1: eos 0.5, a 0.3, b 0.2. After a: eos 0.9, a 0.1. After b: eos 1.0.
HAND = {(): {EOS: 0.5, A: 0.3, B: 0.2}, (A,): {EOS: 0.9, A: 0.1}, (B,): {EOS: 1.0}}


def test_early_stop_when_no_live_hypothesis_can_win() -> None:
    # alpha = 0: "eos" finishes at step 1 with log 0.5; the best live hypothesis (a,
    # log 0.3) can only fall, so the search stops after one decoder step.
    model = TableModel(HAND)
    (best,) = beam_search(model, _src([[A, EOS]]), beam=2, alpha=0.0, extra_len=1)[0]
    assert best.tokens == [] and best.score == pytest.approx(math.log(0.5))
    assert model.steps == 1


def test_no_early_stop_while_the_length_penalty_could_lift_a_live_one() -> None:
    # alpha = 2, longest output 3: the bound for "a ..." is log 0.3 / ((5 + 3) / 6)^2
    # = -0.677 > log 0.5 = -0.693, so the search must go on to step 2, where
    # "a eos" scores log(0.3 * 0.9) / (7/6)^2 = -0.962 and "b eos" log 0.2 / (7/6)^2.
    model = TableModel(HAND)
    bound = math.log(0.3) / ((5 + 3) / 6) ** 2
    assert bound > math.log(0.5)
    hyps = beam_search(model, _src([[A, EOS]]), beam=2, alpha=2.0, nbest=2, extra_len=1)[0]
    assert model.steps >= 2
    assert [h.tokens for h in hyps] == [[], [A]]
    assert hyps[0].score == pytest.approx(math.log(0.5))
    assert hyps[1].score == pytest.approx(math.log(0.3 * 0.9) / (7 / 6) ** 2)
    assert hyps[1].log_prob == pytest.approx(math.log(0.3 * 0.9))


def test_length_penalty_changes_the_winner() -> None:
    # "eos": log 0.4 = -0.916 (lp 1). "a eos": log(0.6 * 0.6) = -1.022, lp(2) with
    # alpha 0 is 1 (short wins), with alpha 1.5 it is (7/6)^1.5 = 1.260: -0.811 (long wins).
    table = {(): {EOS: 0.4, A: 0.6}, (A,): {EOS: 0.6, A: 0.4}}
    short = beam_search(TableModel(table), _src([[A, EOS]]), beam=2, alpha=0.0, extra_len=1)
    long = beam_search(TableModel(table), _src([[A, EOS]]), beam=2, alpha=1.5, extra_len=1)
    assert short[0][0].tokens == []
    assert long[0][0].tokens == [A]
    assert long[0][0].score == pytest.approx(math.log(0.36) / (7 / 6) ** 1.5)


def test_finished_sentences_leave_the_batch() -> None:
    # Sentences starting with b end at once and leave; the others must keep reading
    # their own source (the cross-attention store) and their own prefixes.
    table = {(): {A: 0.9, EOS: 0.1}, (A,): {A: 0.9, EOS: 0.1}, (A, A): {EOS: 1.0}}
    by_source = {B: {(): {EOS: 1.0}}}
    src = _src([[B, EOS], [A, EOS], [B, EOS], [A, A, EOS]])
    expected = [[], [A, A], [], [A, A]]
    model = TableModel(table, by_source)
    assert [r[0].tokens for r in greedy_search(model, src)] == expected
    assert model.steps == 3
    model = TableModel(table, by_source)
    results = beam_search(model, src, beam=3, alpha=0.0, nbest=3)
    assert [r[0].tokens for r in results] == expected
    assert [len(r) for r in results] == [1, 3, 1, 3]
    assert results[1][0].log_prob == pytest.approx(math.log(0.81))


# ----- against greedy, exhaustive search, the uncached decoder, single sentences ----


def _exhaustive(
    model: Transformer, src: Tensor, alpha: float, extra_len: int
) -> list[tuple[float, list[int]]]:
    """Every output of one sentence scored by a full teacher-forced pass, best first."""
    cfg = model.cfg
    longest = int(max_output_lengths(src != cfg.pad_id, extra_len, cfg.max_len)[0])
    words = [i for i in range(cfg.vocab_size) if i not in (cfg.pad_id, cfg.bos_id, cfg.eos_id)]
    scored = []
    for n in range(longest):
        for body in itertools.product(words, repeat=n):
            out = [*body, cfg.eos_id]
            with torch.no_grad():
                logits = model(src, torch.tensor([[cfg.bos_id, *body]]))[0]
            log_probs = logits.log_softmax(-1)
            log_prob = sum(float(log_probs[i, tok]) for i, tok in enumerate(out))
            scored.append((log_prob / length_penalty(len(out), alpha), list(body)))
    return sorted(scored, key=lambda s: -s[0])


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_wide_beam_equals_exhaustive_search(alpha: float) -> None:
    model = _peaky_model(vocab_size=6)  # 3 ordinary tokens besides pad, bos, eos
    src = _src([[4, 5, EOS]])
    reference = _exhaustive(model, src, alpha, extra_len=1)  # outputs of <= 3 tokens + eos
    assert len(reference) == 1 + 3 + 9 + 27
    hyps = beam_search(model, src, beam=40, alpha=alpha, nbest=40, extra_len=1)[0]
    assert [h.tokens for h in hyps] == [tokens for _, tokens in reference]  # the whole ranking
    assert [h.score for h in hyps] == pytest.approx([score for score, _ in reference])


def test_beam_one_equals_greedy() -> None:
    model = _peaky_model(vocab_size=12, dtype=torch.float32)
    src = torch.randint(3, 12, (6, 7))
    src[:, -1] = EOS
    src[2, 4:] = PAD
    greedy = greedy_search(model, src, extra_len=5)
    beam = beam_search(model, src, beam=1, alpha=0.6, extra_len=5)
    assert [g[0].tokens for g in greedy] == [b[0].tokens for b in beam]
    assert [g[0].log_prob for g in greedy] == pytest.approx([b[0].log_prob for b in beam], abs=1e-5)


class Uncached:
    """The same model, but every step recomputes the whole prefix without a key/value cache.

    Its decoding keeps each row's prefix ids and encoder output in the order the
    search's `keep` says; that the reordering itself is right is shown by
    exhaustive search.
    """

    def __init__(self, model: Transformer) -> None:
        self.model, self.cfg = model, model.cfg

    def start(self, src: Tensor, beam: int = 1) -> UncachedDecoding:
        return UncachedDecoding(self.model, src, beam)


class UncachedDecoding:
    def __init__(self, model: Transformer, src: Tensor, beam: int) -> None:
        self.model = model
        rows = torch.arange(src.size(0)).repeat_interleave(beam)
        self.encoded = model.encode(src).index_select(rows)  # one row per hypothesis
        self.input_lengths = (src != model.cfg.pad_id).sum(dim=1)
        self.dtype = self.encoded.hidden.dtype
        self.prefixes = torch.empty(rows.numel(), 0, dtype=torch.long)

    def step(self, last: Tensor) -> Tensor:
        self.prefixes = torch.cat([self.prefixes, last[:, None]], dim=1)
        return self.model.decode(self.prefixes, self.encoded)[:, -1]

    def keep(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        self.prefixes = self.prefixes[rows]
        self.encoded = self.encoded.index_select(rows)


def test_cached_equals_uncached_decoding() -> None:
    model = _peaky_model(vocab_size=16)
    src = torch.randint(3, 16, (3, 6))
    src[:, -1] = EOS
    src[1, 3:] = PAD
    for fn in (greedy_search, lambda m, s: beam_search(m, s, beam=3, nbest=3, extra_len=4)):
        cached, uncached = fn(model, src), fn(Uncached(model), src)
        assert [[h.tokens for h in r] for r in cached] == [[h.tokens for h in r] for r in uncached]
        assert [h.score for r in cached for h in r] == pytest.approx(
            [h.score for r in uncached for h in r]
        )


def test_batch_equals_one_at_a_time() -> None:
    model = _peaky_model(vocab_size=16)
    rows = [[5, 6, 7, 8, EOS], [9, EOS], [3, 4, 10, EOS], [11, 12, 13, 14, 15, 3, EOS]]
    src = _src(rows)
    for config in (DecodeConfig(beam=1), DecodeConfig(beam=4, nbest=2, extra_len=6)):
        batched = search(model, src, config)
        single = [search(model, _src([r]), config)[0] for r in rows]
        assert [[h.tokens for h in r] for r in batched] == [[h.tokens for h in r] for r in single]


def test_nbest_is_sorted_and_distinct() -> None:
    model = _peaky_model(vocab_size=16)
    hyps = beam_search(model, _src([[5, 6, 7, EOS]]), beam=5, nbest=5, extra_len=3)[0]
    assert len(hyps) == 5
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(h.tokens) for h in hyps}) == 5
    for h in hyps:
        assert h.score == pytest.approx(h.log_prob / length_penalty(len(h.tokens) + 1, 0.6))


# ----- sampling ------------------------------------------------------------------


def test_sampling_is_seeded_and_filters() -> None:
    model = _peaky_model(vocab_size=16, dtype=torch.float32)
    src = _src([[5, 6, 7, EOS], [8, 9, EOS]])
    first = sample(model, src, seed=3, temperature=1.5, top_k=5)
    again = sample(model, src, seed=3, temperature=1.5, top_k=5)
    assert [r[0].tokens for r in first] == [r[0].tokens for r in again]
    assert sample(model, src, top_k=1)[0][0].tokens == greedy_search(model, src)[0][0].tokens


def test_filter_logits_top_k_and_top_p() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).log_softmax(-1)
    assert torch.isinf(filter_logits(logits, top_k=2)[0, 2:]).all()
    probs = logits.exp()[0]  # 0.64, 0.24, 0.09, 0.03
    kept = filter_logits(logits, top_p=float(probs[0] + probs[1]) - 1e-3)
    assert torch.isfinite(kept[0, :2]).all() and torch.isinf(kept[0, 2:]).all()
    assert torch.isfinite(filter_logits(logits, top_p=0.01)[0, 0])  # always one token


def test_bad_options_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="nbest"):
        DecodeConfig(beam=2, nbest=3)
    with pytest.raises(ValueError, match="alpha"):
        DecodeConfig(alpha=-1)
    with pytest.raises(ValueError, match="top_p"):
        DecodeConfig(sampling=True, top_p=1.5)
    with pytest.raises(ValueError, match="max_output_len"):
        DecodeConfig(max_output_len=0)
    with pytest.raises(ValueError, match="heuristic"):
        DecodeConfig(early_stopping="sometimes")
    config = DecodeConfig(length_penalty="hf", early_stopping="never", banned_ids=[5])
    assert config.length_penalty is LengthPenalty.HF and config.banned_ids == (5,)
    assert config.early_stopping is EarlyStopping.NEVER


@pytest.mark.parametrize("width", [32_000, 148_000, 20_011])  # 20,011 is prime: plain topk
def test_top_candidates_equal_topk(width: int) -> None:
    torch.manual_seed(0)
    scores = torch.randn(5, width)
    scores[1, : width // 2] = NEVER  # banned tokens and dead beams
    for n in (2, 8):
        values, index = top_candidates(scores, n)
        expected_values, expected_index = scores.topk(n, dim=1)
        assert torch.equal(values, expected_values) and torch.equal(index, expected_index)


def test_beam_search_over_a_large_vocabulary_takes_the_chunked_path_unchanged(monkeypatch) -> None:
    model = _peaky_model(8000, seed=3, dtype=torch.float32)
    src = torch.randint(3, 8000, (3, 7))
    src[:, -1] = EOS
    fast = beam_search(model, src, beam=4, extra_len=5)
    calls = []

    def plain_topk(scores: Tensor, n: int):
        calls.append(scores.shape)
        return scores.topk(n, dim=1)

    monkeypatch.setattr(aiayn.inference.search, "top_candidates", plain_topk)
    assert beam_search(model, src, beam=4, extra_len=5) == fast
    assert calls and calls[0][1] == 4 * 8000  # the chunked path was the one replaced
