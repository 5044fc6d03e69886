"""Decoding settings shared below the search (`aiayn.inference.search.DecodeConfig`, and
the Marian reader and the exporters, which sit below inference): the length penalty's
form, when beam search stops, and the largest beam and exponent taken.
"""

from __future__ import annotations

from enum import Enum


class LengthPenalty(str, Enum):
    """The form of the length penalty lp(Y) that finished scores are divided by."""

    GNMT = "gnmt"  # ((5 + |Y|) / 6)^alpha, Wu et al. 2016 eq. 14 (the paper's, section 6)
    HF = "hf"  # |Y|^alpha, Hugging Face `transformers`' length_penalty (Marian / opus-mt)


class EarlyStopping(str, Enum):
    """When beam search stops extending a sentence (besides reaching its longest output).

    EXACT: K hypotheses have finished, or earlier, when no live hypothesis can still
        enter the n-best list (a true bound). The n-best equal those of `transformers`'
        `early_stopping=True`.
    HEURISTIC: K have finished and the best live hypothesis, normalised at its
        current length, scores no better than the worst finished one (`transformers`'
        `early_stopping=False`, its default and Marian's). Not a bound: a longer
        hypothesis could still have won.
    NEVER: as HEURISTIC, normalised at the longest output length (`transformers`'
        `early_stopping="never"`).
    """

    EXACT = "exact"
    HEURISTIC = "heuristic"
    NEVER = "never"


MAX_BEAM = 1024
"""The widest beam taken. Each step scores beam x vocabulary candidates per sentence
and keeps beam x length tokens and a key/value cache per hypothesis: a beam of 10**11
asks for terabytes. Useful beams are far narrower (the paper's is 4)."""

MAX_ALPHA = 10.0
"""The largest length-penalty exponent taken: ((5 + 4096) / 6) ** 10 is about 2e28,
still finite in float32, the type scores are ranked in; an exponent of 20 would
overflow it, and useful ones lie between 0 and 2."""
