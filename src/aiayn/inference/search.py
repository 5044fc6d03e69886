"""Search over the incremental decoder: greedy, beam search (section 6) and sampling.

Shape legend:
    B sentences, N sentences still being decoded, K beam width, P n-best kept,
    S source length, L longest output allowed, V vocabulary.

The search knows the model only through `aiayn.inference.decoding.start`, which
returns a `Decoding` (see `Decodable`): the state of one batch (an encoder-decoder's
encoder output and key/value cache) with a `step` and a `keep`. The encoder runs once per batch;
every step feeds the decoder one new token per row and the key/value cache holds
the prefix, so no step recomputes it. Sentences that are done leave the batch (and the cache) at once, so they stop
costing compute. Everything inside a step is batched over sentences and beams. What
every search shares (the next token's log-probabilities under the token rules, the
length penalty, the longest output, `Hypothesis`) is `aiayn.inference.scoring`'s.

Conventions, shared by every function here:
    - The output length counts the generated tokens including the final eos.
    - The longest output is `source length + extra_len` (section 6: input length +
      50), source length counting real tokens (its eos included), and at most
      `max_output_len` when one is given, clipped to the model's `max_len`; at that
      length only eos may follow.
    - pad and bos are never generated, nor any `banned_ids` (their log-probabilities
      are set to -inf, without renormalising the rest unless `renormalize` is set).

Hugging Face `transformers` (5.x) generation, which Marian / opus-mt models are
run with, is expressed in the same terms (see `aiayn.io.marian.MarianGeneration`):
`max_length` M counts the decoder start token, so `max_output_len = M - 1` with no
source-relative limit; `forced_eos_token_id` forces eos at that length with
log-probability 0 (`free_forced_eos`); `length_penalty` divides by |Y|^alpha
(`LengthPenalty.HF`); `early_stopping` False / True / "never" is
`EarlyStopping.HEURISTIC` / `EXACT` / `NEVER`; `bad_words_ids` of one token are
`banned_ids`; `renormalize_logits` is `renormalize`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.config import (
    MAX_ALPHA,
    MAX_BEAM,
    EarlyStopping,
    LengthPenalty,
    check_field_types,
    check_seed,
    enum_member,
)
from aiayn.inference.decoding import Decodable, start
from aiayn.inference.scoring import (
    NEG_INF,
    Hypothesis,
    TokenRules,
    apply_rules,
    check_search,
    length_penalty,
    max_output_lengths,
    next_log_probs,
    normalised,
    score_dtype,
)

# The search's names, with those that lived here before `aiayn.inference.scoring` took
# them (still importable from here).
__all__ = [
    "NEG_INF",
    "TEMPERATURE_RANGE",
    "Decodable",
    "DecodeConfig",
    "EarlyStopping",
    "Finished",
    "Hypothesis",
    "LengthPenalty",
    "Picker",
    "TokenRules",
    "apply_rules",
    "beam_search",
    "check_sampling",
    "filter_logits",
    "greedy_pick",
    "greedy_search",
    "length_penalty",
    "max_output_lengths",
    "next_log_probs",
    "normalised",
    "sample",
    "sampling_picker",
    "search",
    "top_candidates",
]

log = logging.getLogger(__name__)

TEMPERATURE_RANGE = (1e-6, 1e6)
"""Temperatures taken. The log-probabilities (float32, -log V or above at their
maximum) divided by one inside stay finite; outside, sampling is already greedy
(below) or uniform (above) to float32's precision."""


# ----- greedy search and sampling: one path per sentence ----------------------


Picker = Callable[[Tensor], Tensor]  # (N, V) log-probs -> (N,) chosen ids


@torch.no_grad()
def _one_path_search(
    model: Decodable,
    src: Tensor,
    extra_len: int | None,
    pick: Picker,
    max_output_len: int | None,
    rules: TokenRules,
) -> list[list[Hypothesis]]:
    """Extend one prefix per sentence with `pick` until eos or the length limit."""
    check_search(model, src, extra_len, max_output_len)
    cfg = model.cfg
    batch, device = src.size(0), src.device
    decoding = start(model, src)
    max_out = max_output_lengths(decoding.input_lengths, extra_len, cfg.max_len, max_output_len)
    longest = int(max_out.max())
    limits = set(max_out.tolist())  # steps at which some sentence may only end
    dtype = score_dtype(decoding)

    tokens = torch.full((batch, longest + 1), cfg.pad_id, dtype=torch.long, device=device)
    tokens[:, 0] = cfg.bos_id
    log_prob = torch.zeros(batch, dtype=dtype, device=device)
    sentence = torch.arange(batch, device=device)  # original index of each live row
    out_tokens = torch.full_like(tokens[:, 1:], cfg.pad_id)  # (B, L)
    out_log_prob = torch.zeros(batch, dtype=dtype, device=device)

    for t in range(1, longest + 1):
        at_limit = max_out == t if t in limits else None
        log_probs = next_log_probs(cfg, decoding, tokens[:, t - 1], rules, at_limit)
        chosen = pick(log_probs)  # (N,)
        tokens[:, t] = chosen
        log_prob = log_prob + log_probs.gather(1, chosen[:, None]).squeeze(1)
        done = chosen == cfg.eos_id
        if bool(done.any()):
            out_tokens[sentence[done]] = tokens[done, 1:]
            out_log_prob[sentence[done]] = log_prob[done]
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            tokens, log_prob = tokens[keep], log_prob[keep]
            sentence, max_out = sentence[keep], max_out[keep]
            decoding.keep(keep, keep)

    return [
        [Hypothesis(tokens=ids, log_prob=lp, score=lp)]
        for ids, lp in zip(
            _strip(out_tokens, cfg.eos_id, cfg.pad_id), out_log_prob.tolist(), strict=True
        )
    ]


def _strip(tokens: Tensor, eos_id: int, pad_id: int) -> list[list[int]]:
    """Rows of ids cut at the first eos (pad never occurs before it)."""
    out = []
    for row in tokens.tolist():
        end = row.index(eos_id) if eos_id in row else len(row)
        out.append([i for i in row[:end] if i != pad_id])
    return out


def greedy_pick(log_probs: Tensor) -> Tensor:
    """The most probable id of each row of (N, V) scores: (N,)."""
    # max(dim) returns the first maximum, as argmax does, at a third of its cost on
    # the CPU (32 x 8000: 72 vs 193 us; its reduction is vectorised, argmax's not).
    return log_probs.max(dim=-1).indices


def sampling_picker(
    temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator
) -> Picker:
    """A `Picker` drawing each row's id from its filtered distribution (see `sample`)."""
    check_sampling(temperature, top_k, top_p)

    def pick(log_probs: Tensor) -> Tensor:
        probs = filter_logits(log_probs, temperature, top_k, top_p).softmax(dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)

    return pick


def greedy_search(
    model: Decodable,
    src: Tensor,
    extra_len: int | None = 50,
    *,
    max_output_len: int | None = None,
    rules: TokenRules | None = None,
) -> list[list[Hypothesis]]:
    """The most probable next token at every step.

    Args:
        model: an encoder-decoder in eval mode (see `Decodable`).
        src: (B, S) source ids, padded with `cfg.pad_id`.
        extra_len: the output may be this many tokens longer than the source (None:
            no source-relative limit).
        max_output_len: the longest output, eos included, if given.
        rules: banned tokens and renormalisation (default: none).

    Returns:
        Per sentence, a one-element list with its `Hypothesis`.
    """
    return _one_path_search(
        model,
        src,
        extra_len,
        greedy_pick,
        max_output_len,
        rules or TokenRules(),
    )


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise a ValueError naming the first sampling option out of range."""
    low, high = TEMPERATURE_RANGE
    if not low <= temperature <= high:  # nan too
        raise ValueError(
            f"temperature must be a positive finite number in [{low:g}, {high:g}], "
            f"got {temperature}"
        )
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")


def filter_logits(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """Temperature, then top-k, then top-p (nucleus) filtering of (N, V) scores.

    Filtered entries become -inf. Top-p keeps the smallest set of most probable
    tokens whose probability reaches `top_p` (always at least one).
    """
    check_sampling(temperature, top_k, top_p)
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the more probable tokens
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, NEG_INF)
    return logits


def sample(
    model: Decodable,
    src: Tensor,
    extra_len: int | None = 50,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    *,
    max_output_len: int | None = None,
    rules: TokenRules | None = None,
) -> list[list[Hypothesis]]:
    """Draw one output per sentence from the model's (filtered) distribution, seeded.

    The same model, batch and seed give the same samples. `Hypothesis.log_prob` is
    under the model's own distribution, before temperature and filtering.

    Args:
        model, src, extra_len, max_output_len, rules: as for `greedy_search`.
        temperature: divides the logits (< 1 sharper, > 1 flatter).
        top_k: sample among the k most probable tokens only.
        top_p: sample among the most probable tokens holding this much mass.
        seed: seeds a generator of its own (the global RNG is left alone), in
            [0, 2**63 - 1].
    """
    check_seed(seed, "seed")
    generator = torch.Generator(device=src.device).manual_seed(seed)
    pick = sampling_picker(temperature, top_k, top_p, generator)
    return _one_path_search(model, src, extra_len, pick, max_output_len, rules or TokenRules())


# ----- beam search ---------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _chunk_size(width: int) -> int | None:
    """The divisor of `width` in [64, 256] closest to 128 (None if there is none)."""
    divisors = [d for d in range(64, 257) if width % d == 0]
    return min(divisors, key=lambda d: abs(d - 128)) if divisors else None


def top_candidates(scores: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """`scores.topk(n, dim=1)` for (N, C) scores, faster for long rows on the CPU.

    The n best of a row lie in the n chunks (of ~128 consecutive candidates) with
    the highest maxima: a chunk whose maximum ranks below n such maxima holds
    nothing better than n other candidates. So the rows' chunk maxima (a
    vectorised reduction) pick n chunks each, and topk runs over their candidates
    only (its speed against topk: benchmarks/bench_kernels.py). Values and indices equal
    topk's where scores are distinct.
    """
    rows, width = scores.shape
    chunk = _chunk_size(width)
    if scores.device.type != "cpu" or chunk is None or width < 8 * n * chunk:
        return scores.topk(n, dim=1)
    chunks = scores.view(rows, width // chunk, chunk)
    _, best_chunks = chunks.amax(dim=2).topk(n, dim=1)  # (N, n)
    picked = chunks.gather(1, best_chunks[:, :, None].expand(-1, -1, chunk))  # (N, n, chunk)
    values, where = picked.view(rows, n * chunk).topk(n, dim=1)
    return values, best_chunks.gather(1, where // chunk) * chunk + where % chunk


@torch.no_grad()
def beam_search(
    model: Decodable,
    src: Tensor,
    beam: int = 4,
    alpha: float = 0.6,
    nbest: int = 1,
    extra_len: int | None = 50,
    *,
    max_output_len: int | None = None,
    rules: TokenRules | None = None,
    penalty: LengthPenalty = LengthPenalty.GNMT,
    early_stopping: EarlyStopping = EarlyStopping.EXACT,
) -> list[list[Hypothesis]]:
    """Beam search with GNMT's length penalty (section 6: beam 4, alpha 0.6).

    Each step extends the K live hypotheses of every sentence by every token and
    ranks the K*V candidates by log-probability. Of the best 2K, those ending in
    eos that rank among the best K become finished (their score is normalised by
    `length_penalty`), and the best K that do not end in eos stay live (as in
    fairseq and tensor2tensor, 2K candidates always hold K that continue).

    A sentence is done when K hypotheses have finished, or earlier, when no live
    hypothesis can still enter its n-best list: a live log-probability only falls
    as it grows and lp grows at most to lp(longest output), so the best live
    hypothesis can score at most `log_prob / length_penalty(longest, alpha)`. Done
    sentences leave the batch and the cache. `early_stopping` HEURISTIC and NEVER
    replace this rule by `transformers`' (see `EarlyStopping`); then the K best
    finished hypotheses are kept, and the n-best returned from them.

    With K = 1 this is greedy search. With K at least the number of possible
    outputs (tiny vocabularies and lengths) nothing is pruned: exhaustive search.

    Args:
        model: an encoder-decoder in eval mode (see `Decodable`).
        src: (B, S) source ids, padded with `cfg.pad_id`.
        beam: K, hypotheses kept per sentence.
        alpha: length-penalty exponent (>= 0).
        nbest: finished hypotheses returned per sentence (<= beam).
        extra_len: the output may be this many tokens longer than the source (None:
            no source-relative limit).
        max_output_len: the longest output, eos included, if given.
        rules: banned tokens, renormalisation, forced eos (default: none).
        penalty: the length penalty's form (GNMT, or HF for `transformers`').
        early_stopping: when a sentence is done (see `EarlyStopping`).

    Returns:
        Per sentence, up to `nbest` hypotheses, best first.

    Raises:
        ValueError: on a bad beam, alpha, nbest or extra_len.
    """
    if not 1 <= beam <= MAX_BEAM:
        raise ValueError(f"beam must lie in [1, {MAX_BEAM}], got {beam}")
    if not 0 <= alpha <= MAX_ALPHA:
        raise ValueError(f"alpha must lie in [0, {MAX_ALPHA:g}], got {alpha}")
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must lie in [1, beam={beam}], got {nbest}")
    check_search(model, src, extra_len, max_output_len)
    rules = rules or TokenRules()
    cfg = model.cfg
    exact = early_stopping is EarlyStopping.EXACT
    k, n_keep, vocab = beam, (nbest if exact else beam), cfg.vocab_size
    batch, device = src.size(0), src.device

    decoding = start(model, src, beam=k)
    max_out = max_output_lengths(decoding.input_lengths, extra_len, cfg.max_len, max_output_len)
    longest = int(max_out.max())
    limits = set(max_out.tolist())  # steps at which some sentence may only end
    dtype = score_dtype(decoding)

    # Live hypotheses: tokens[n, j, t] is token t of beam j (column 0 is bos).
    tokens = torch.full((batch, k, longest + 1), cfg.pad_id, dtype=torch.long, device=device)
    tokens[:, :, 0] = cfg.bos_id
    scores = torch.full((batch, k), NEG_INF, dtype=dtype, device=device)  # summed log-probs
    scores[:, 0] = 0.0  # all beams start equal: keep one, or the first step picks duplicates
    sentence = torch.arange(batch, device=device)

    finished = Finished.empty(batch, n_keep, longest, cfg.pad_id, dtype, device)  # live sentences
    results = Finished.empty(batch, n_keep, longest, cfg.pad_id, dtype, device)  # all, by index
    lp_longest = length_penalty(max_out.to(dtype), alpha, penalty)  # (B,)

    for t in range(1, longest + 1):
        n_live = scores.size(0)
        last = tokens[:, :, t - 1].reshape(n_live * k)
        at_limit = (max_out == t).repeat_interleave(k) if t in limits else None
        log_probs = next_log_probs(cfg, decoding, last, rules, at_limit)
        # In place: log_probs is this step's own tensor (and the largest of a step).
        candidates = log_probs.view(n_live, k, vocab).add_(scores[:, :, None]).view(n_live, -1)
        top_scores, top_index = top_candidates(candidates, 2 * k)  # (N, 2K), best first
        parent, token = top_index // vocab, top_index % vocab
        ends = token == cfg.eos_id

        # Candidates ending in eos among the best K finish.
        finishing = ends[:, :k] & (top_scores[:, :k] > NEG_INF)
        if bool(finishing.any()):
            new_tokens = tokens.gather(1, parent[:, :k, None].expand(-1, -1, longest + 1))
            new_tokens = new_tokens[:, :, 1:].clone()  # (N, K, L) without bos
            new_tokens[:, :, t - 1] = cfg.eos_id
            new_scores = top_scores[:, :k] / length_penalty(t, alpha, penalty)
            finished.add(new_tokens, new_scores, top_scores[:, :k], finishing)

        # The best K candidates not ending in eos stay live.
        live_scores, pick = top_scores.masked_fill(ends, NEG_INF).topk(k, dim=1)  # (N, K)
        live_parent = parent.gather(1, pick)
        tokens = tokens.gather(1, live_parent[:, :, None].expand(-1, -1, longest + 1))
        tokens[:, :, t] = token.gather(1, pick)
        scores = live_scores

        lp_now = (  # what the heuristic rules normalise the best live score by
            lp_longest
            if exact or early_stopping is EarlyStopping.NEVER
            else length_penalty(t, alpha, penalty)
        )
        done = finished.settled(scores[:, 0] / lp_now, k, exact) | (max_out <= t)
        parent_rows = (torch.arange(n_live, device=device)[:, None] * k + live_parent).view(-1)
        if not bool(done.any()):
            decoding.keep(parent_rows)  # every sentence stays
            continue

        results.put(sentence[done], finished.select(done))
        keep = (~done).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        decoding.keep(parent_rows.view(n_live, k)[keep].view(-1), keep)
        tokens, scores, sentence = tokens[keep], scores[keep], sentence[keep]
        finished = finished.select(keep)
        max_out, lp_longest = max_out[keep], lp_longest[keep]

    return results.nbest_lists(nbest, cfg.eos_id, cfg.pad_id)


@dataclass
class Finished:
    """Finished hypotheses of beam search, the best P per sentence, best first.

    Attributes:
        tokens: (N, P, L) ids, eos included, padded.
        scores: (N, P) normalised scores (-inf where none).
        log_probs: (N, P) summed log-probabilities.
        count: (N,) hypotheses finished so far, kept or not.
    """

    tokens: Tensor
    scores: Tensor
    log_probs: Tensor
    count: Tensor

    @classmethod
    def empty(
        cls, n: int, p: int, longest: int, pad_id: int, dtype: torch.dtype, device: torch.device
    ) -> Finished:
        return cls(
            torch.full((n, p, longest), pad_id, dtype=torch.long, device=device),
            torch.full((n, p), NEG_INF, dtype=dtype, device=device),
            torch.full((n, p), NEG_INF, dtype=dtype, device=device),
            torch.zeros(n, dtype=torch.long, device=device),
        )

    def add(self, tokens: Tensor, scores: Tensor, log_probs: Tensor, finishing: Tensor) -> None:
        """Merge (N, K) candidates where `finishing`, keeping the best P per sentence."""
        scores = scores.masked_fill(~finishing, NEG_INF)
        self.scores, best = torch.cat([self.scores, scores], dim=1).topk(self.scores.size(1), dim=1)
        self.log_probs = torch.cat([self.log_probs, log_probs], dim=1).gather(1, best)
        pool = torch.cat([self.tokens, tokens], dim=1)  # (N, P + K, L)
        self.tokens = pool.gather(1, best[:, :, None].expand(-1, -1, pool.size(2)))
        self.count = self.count + finishing.sum(dim=1)

    def settled(self, best_live: Tensor, k: int, exact: bool) -> Tensor:
        """(N,) sentences whose n-best can no longer change (see `EarlyStopping`).

        Args:
            best_live: each sentence's best live score, normalised: by the longest
                output's length penalty (EXACT: the best it can ever reach), or as
                the heuristic rules say.
            k: the beam; K finished hypotheses always settle EXACT.
            exact: EXACT, or transformers' heuristics (which need K finished).
        """
        worst_kept_wins = self.scores[:, -1] >= best_live
        if exact:
            return (self.count >= k) | worst_kept_wins
        return (self.count >= k) & worst_kept_wins

    def select(self, rows: Tensor) -> Finished:
        return Finished(
            self.tokens[rows], self.scores[rows], self.log_probs[rows], self.count[rows]
        )

    def put(self, rows: Tensor, other: Finished) -> None:
        """Store `other`'s sentences at `rows` (results, by original sentence index)."""
        self.tokens[rows], self.scores[rows], self.log_probs[rows] = (
            other.tokens,
            other.scores,
            other.log_probs,
        )

    def nbest_lists(self, nbest: int, eos_id: int, pad_id: int) -> list[list[Hypothesis]]:
        """Up to `nbest` `Hypothesis` per sentence, best first."""
        n, p, longest = self.tokens.shape
        flat_tokens = _strip(self.tokens.view(n * p, longest), eos_id, pad_id)
        return [
            [
                Hypothesis(tokens=flat_tokens[b * p + i], log_prob=lp, score=s)
                for i, (s, lp) in enumerate(zip(row_scores, row_log_probs, strict=True))
                if s > NEG_INF
            ][:nbest]
            for b, (row_scores, row_log_probs) in enumerate(
                zip(self.scores.tolist(), self.log_probs.tolist(), strict=True)
            )
        ]


# ----- one entry point -----------------------------------------------------------


@dataclass(frozen=True)
class DecodeConfig:
    """How to search: beam search by default (section 6), greedy for beam 1, or sampling.

    The defaults are the paper's (section 6). `DecodeConfig(**generation.search_settings())`
    of an `aiayn.io.marian.MarianGeneration` reproduces `transformers`' generation for a
    Marian model.

    Attributes:
        beam: beam width K (1 = greedy search).
        alpha: length-penalty exponent of beam search.
        nbest: hypotheses returned per sentence (<= beam; 1 when sampling).
        extra_len: the output may be this many tokens longer than the source (None:
            no source-relative limit).
        sampling: draw from the model's distribution instead of searching.
        temperature, top_k, top_p, seed: sampling options; see `sample`.
        max_output_len: the longest output, eos included, whatever the source (None:
            only `extra_len` and the model's `max_len` limit it).
        length_penalty: the penalty's form, GNMT (the paper) or HF.
        early_stopping: when beam search finishes a sentence; see `EarlyStopping`.
        banned_ids: tokens never generated (pad and bos never are).
        renormalize: renormalise log-probabilities after banning; see `TokenRules`.
        free_forced_eos: eos forced at the longest output scores 0; see `TokenRules`.
    """

    beam: int = 4
    alpha: float = 0.6
    nbest: int = 1
    extra_len: int | None = 50
    sampling: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    max_output_len: int | None = None
    length_penalty: LengthPenalty = LengthPenalty.GNMT
    early_stopping: EarlyStopping = EarlyStopping.EXACT
    banned_ids: tuple[int, ...] = ()
    renormalize: bool = False
    free_forced_eos: bool = False

    def __post_init__(self) -> None:
        check_field_types(self)
        if not 1 <= self.beam <= MAX_BEAM:
            raise ValueError(f"DecodeConfig.beam must lie in [1, {MAX_BEAM}], got {self.beam}")
        if not 0 <= self.alpha <= MAX_ALPHA:  # nan would rank nothing; see MAX_ALPHA
            raise ValueError(
                f"DecodeConfig.alpha must be a finite number in [0, {MAX_ALPHA:g}], "
                f"got {self.alpha}"
            )
        if not 1 <= self.nbest <= (1 if self.sampling else self.beam):
            raise ValueError(
                f"DecodeConfig.nbest must lie in [1, beam={self.beam}] (1 when sampling), "
                f"got {self.nbest}"
            )
        if self.extra_len is not None and self.extra_len < 0:
            raise ValueError(f"DecodeConfig.extra_len must be >= 0, got {self.extra_len}")
        if self.max_output_len is not None and self.max_output_len < 1:
            raise ValueError(f"DecodeConfig.max_output_len must be >= 1, got {self.max_output_len}")
        check_sampling(self.temperature, self.top_k, self.top_p)
        check_seed(self.seed, "DecodeConfig.seed")
        # Accept the enums' values as strings (from JSON or a command line).
        for name, kind in (("length_penalty", LengthPenalty), ("early_stopping", EarlyStopping)):
            member = enum_member(kind, getattr(self, name), f"DecodeConfig.{name}")
            object.__setattr__(self, name, member)
        object.__setattr__(self, "banned_ids", tuple(int(i) for i in self.banned_ids))

    @property
    def rules(self) -> TokenRules:
        return TokenRules(self.banned_ids, self.renormalize, self.free_forced_eos)


def search(model: Decodable, src: Tensor, config: DecodeConfig) -> list[list[Hypothesis]]:
    """Decode a batch as `config` says: sampling, greedy (beam 1) or beam search."""
    limits = {"max_output_len": config.max_output_len, "rules": config.rules}
    if config.sampling:
        return sample(
            model,
            src,
            config.extra_len,
            config.temperature,
            config.top_k,
            config.top_p,
            config.seed,
            **limits,
        )
    if config.beam == 1:
        return greedy_search(model, src, config.extra_len, **limits)
    return beam_search(
        model,
        src,
        config.beam,
        config.alpha,
        config.nbest,
        config.extra_len,
        penalty=config.length_penalty,
        early_stopping=config.early_stopping,
        **limits,
    )
