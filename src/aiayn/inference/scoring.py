"""What every search shares: the next token's log-probabilities under the token rules,
the length penalty, the longest output allowed and the hypotheses returned.

`aiayn.inference.search` (greedy, sampling, beam search) and the continuous engine
(`aiayn.inference.engine`) step through these; see the search module for the
conventions (output lengths count the final eos; pad and bos are never generated).

Shape legend: N rows (sentences, or hypotheses) being decoded, B sentences, S source
length, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.config import LengthPenalty, ModelConfig
from aiayn.inference.decoding import Decodable, Decoding

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Hypothesis:
    """One output sentence of a search.

    Attributes:
        tokens: generated ids, without bos and the final eos.
        log_prob: sum of the model's log-probabilities of the tokens and the eos.
        score: what the search ranked by: `log_prob / length_penalty(len + 1, alpha)`
            for beam search, `log_prob` itself for greedy search and sampling.
            (With `free_forced_eos` a forced final eos adds 0 to `log_prob`.)
    """

    tokens: list[int]
    log_prob: float
    score: float


def length_penalty(
    length: int | float | Tensor, alpha: float, form: LengthPenalty = LengthPenalty.GNMT
) -> float | Tensor:
    """The length penalty lp(Y): GNMT's ((5 + |Y|) / 6)^alpha or Hugging Face's |Y|^alpha.

    Beam search ranks finished hypotheses by log P(Y|X) / lp(Y); the paper uses
    GNMT's form (Wu et al. 2016, eq. 14) with alpha = 0.6 (section 6). alpha = 0
    gives lp = 1, plain log-probability.

    Args:
        length: |Y|, output tokens including eos (an int, float or tensor); for the
            HF form this is `transformers`' generated length, its decoder start
            token excluded and the final eos included.
        alpha: the exponent, >= 0.
        form: GNMT (default) or HF.
    """
    if form is LengthPenalty.HF:
        return length**alpha
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(
    real_tokens: Tensor, extra_len: int | None, max_len: int, max_output_len: int | None = None
) -> Tensor:
    """Longest output per sentence: source length + `extra_len`, at most `max_len`.

    Args:
        real_tokens: (B, S) bool, True at real source tokens; or (B,) source lengths.
        extra_len: tokens allowed beyond the source length (the paper: 50); None for
            no source-relative limit.
        max_len: the model's `max_len` (the decoder sees bos + all but the last token).
        max_output_len: an absolute limit as well, if given.

    Returns:
        (B,) int64, each >= 1.
    """
    limit = max_len if max_output_len is None else min(max_len, max_output_len)
    lengths = real_tokens.sum(dim=1) if real_tokens.dim() == 2 else real_tokens
    if extra_len is None:
        return torch.full_like(lengths, limit, dtype=torch.long)
    return (lengths + extra_len).clamp(min=1, max=limit)


@dataclass(frozen=True)
class TokenRules:
    """What may follow a prefix, beyond the model's distribution.

    Attributes:
        banned_ids: never generated, besides pad and bos (which never are).
        renormalize: after banning (and forcing eos), renormalise the
            log-probabilities over the tokens left (`transformers`' renormalize_logits).
        free_forced_eos: where only eos may follow (the longest output), it gets
            log-probability 0 instead of the model's (`transformers`'
            forced_eos_token_id replaces the distribution).
    """

    banned_ids: tuple[int, ...] = ()
    renormalize: bool = False
    free_forced_eos: bool = False


def next_log_probs(
    cfg: ModelConfig,
    decoding: Decoding,
    last: Tensor,
    rules: TokenRules,
    at_limit: Tensor | None = None,
) -> Tensor:
    """Log-probabilities of the next token after each row's prefix: (rows, V).

    Rows where `at_limit` (rows,) is True may only end (see `_only_eos`).
    """
    logits = decoding.step(last)  # (rows, V), only the new position
    return apply_rules(cfg, normalised(cfg, logits), rules, at_limit)


def normalised(cfg: ModelConfig, logits: Tensor) -> Tensor:
    """(rows, V) logits -> log-probabilities in at least float32, pad and bos at -inf.

    The logits are taken as this step's own: they may be overwritten."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # sum log-probabilities in at least float32
    logits = logits.contiguous()  # a copy only if the model returned more positions
    # In place (the logits are this step's own): no second (rows, V) tensor per step.
    log_probs = torch.log_softmax(logits, dim=-1, out=logits)
    log_probs[:, cfg.pad_id] = NEG_INF
    log_probs[:, cfg.bos_id] = NEG_INF
    return log_probs


def apply_rules(
    cfg: ModelConfig, log_probs: Tensor, rules: TokenRules, at_limit: Tensor | None = None
) -> Tensor:
    """`rules` (banned ids, eos only where `at_limit`, renormalisation) applied to (rows, V)
    log-probabilities from `normalised` (in place where it can)."""
    if rules.banned_ids:
        log_probs[:, list(rules.banned_ids)] = NEG_INF
    if at_limit is not None:
        log_probs = _only_eos(log_probs, at_limit, cfg.eos_id, rules.free_forced_eos)
    if rules.renormalize:
        log_probs = log_probs.log_softmax(dim=-1)
    return log_probs


def _only_eos(log_probs: Tensor, rows: Tensor, eos_id: int, free: bool = False) -> Tensor:
    """Forbid every token but eos in the `rows` (N,) of (N, V) that reached their limit.

    With `free`, eos gets log-probability 0 there.
    """
    not_eos = torch.ones(log_probs.size(-1), dtype=torch.bool, device=log_probs.device)
    not_eos[eos_id] = False
    log_probs = log_probs.masked_fill(rows[:, None] & not_eos, NEG_INF)
    if free:
        log_probs[:, eos_id] = log_probs[:, eos_id].masked_fill(rows, 0.0)
    return log_probs


def score_dtype(decoding: Decoding) -> torch.dtype:
    """Scores are summed in float32, or in float64 for a float64 model (exactness tests)."""
    return torch.float64 if decoding.dtype == torch.float64 else torch.float32


def check_search(
    model: Decodable, src: Tensor, extra_len: int | None, max_output_len: int | None = None
) -> None:
    if src.dim() != 2 or src.size(0) == 0:
        raise ValueError(f"src must be a non-empty (batch, length) tensor, got {tuple(src.shape)}")
    if extra_len is not None and extra_len < 0:
        raise ValueError(f"extra_len must be >= 0, got {extra_len}")
    if max_output_len is not None and max_output_len < 1:
        raise ValueError(f"max_output_len must be >= 1, got {max_output_len}")
