"""Which type `aiayn translate`, `aiayn serve` and the quickstart's test translation decode
in by default (`--dtype auto`): float32 or bfloat16, whichever decodes the model faster here.

    fp32, bf16 = freeze(model), freeze(model, torch.bfloat16)
    choice = timed_choice(fp32, bf16, src, beam=4)    # src: (B, S) the batch that will run
    choice.chosen                                     # "float32" or "bfloat16"
    choice.line()                                     # the line `log.info` writes

`Translator.choose_precision` runs it on the batch a translator is about to decode.

Whether bfloat16 pays depends on the CPU and on the work, not on a flag: with AMX its
products are several times faster than float32's; with AVX512-BF16 alone they are faster
on some machines and shapes and slower on others (docs/explanation/results/cpu-inference.md);
without either, bfloat16 is emulated. So
the model's own decoding steps are timed, at the batch that will run, in each type
(`bf16_decoding_speedup`): a step is what decoding repeats once per output token, so its
time is the translation's. Training's `precision: auto` times square products instead
(`aiayn.training.precision`); both time through `fastest_seconds`.

bfloat16 is taken only where it wins by `BF16_MIN_SPEEDUP`; float32 otherwise. Its
translations differ from float32's (and from the quickstart's references, decoded in
float32), and they depend on the batch (docs/reference/cli.md): that is worth paying for
a clear gain only, not for a tie that the next timing could reverse.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.inference.decoding import Decodable, start
from aiayn.training.precision import fastest_seconds

log = logging.getLogger(__name__)

BF16_MIN_SPEEDUP = 1.2
"""bfloat16 decodes by default only where its steps are timed this much faster than
float32's: where it saves at least a sixth of the decoding time. Some of its translations
differ from float32's (docs/explanation/results/cpu-inference.md measures how many, and
BLEU), so a tie, or the few percent by which a second timing of the same steps differs,
does not pay for that; where bfloat16 really pays (AMX: several times faster products) it
clears the margin by far. Training's `precision: auto` asks less
(`aiayn.training.precision.BF16_MIN_SPEEDUP`): there no output is compared line by line.
A machine under heavy load times mostly noise (docs/reference/cli.md): where the outputs
must not depend on it, give the type (`--dtype`)."""

TIMED_STEPS = 6
"""Timed decoding steps of each type, in turns, after one untimed step each. The timing
also pays an encoder pass in each type and the freezing of the bfloat16 copy (what it took
for the quickstart's model: docs/reference/cli.md)."""

MAX_TIMED_ROWS = 128
"""The most hypothesis rows (sentences x beam) a timing decodes: of a larger first batch,
its longest sentences that fit. A step's cost grows with its rows, and the timing should
stay near a second; a larger batch runs the same products on more rows, where bfloat16
gains no less, so the cut errs towards float32, as the margin does."""

SERVED_SOURCE_TOKENS = 32
"""The source length a server's precision is timed at (`sample_rows`): a sentence of
about 25 words. A server does not know its requests before it starts."""


@dataclass(frozen=True)
class PrecisionChoice:
    """The type a translator decodes in, and on what measure it was chosen.

    Attributes:
        requested: "auto", or the type asked for ("float32", "bfloat16", "int8", ...).
        chosen: the type decoded in, by torch's name.
        bf16_speedup: where auto timed the steps, float32's time per step over
            bfloat16's (> 1: bfloat16 is faster); None where nothing was timed.
        rows: the hypothesis rows each timed step decoded (sentences x beam); 0 where
            nothing was timed.
        untimed: why auto timed nothing ("the weights are int8", ...); "" otherwise.
    """

    requested: str
    chosen: str
    bf16_speedup: float | None = None
    rows: int = 0
    untimed: str = ""

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.chosen)

    def line(self) -> str:
        """One line for people, e.g. "decoding precision: float32 (auto: bfloat16 steps
        timed 0.85x float32's at 512 rows; bfloat16 needs 1.2x)"."""
        line = f"decoding precision: {self.chosen}"
        if self.bf16_speedup is not None:
            line += (
                f" ({self.requested}: bfloat16 steps timed {self.bf16_speedup:.2f}x float32's "
                f"at {self.rows} rows; bfloat16 needs {BF16_MIN_SPEEDUP:g}x)"
            )
        elif self.untimed:
            line += f" ({self.requested}: {self.untimed})"
        return line

    def record(self) -> dict[str, object]:
        """What results.json and the server's /info keep: "requested" and "chosen", and
        where auto timed the steps "bf16_speedup" (2 decimals), "bf16_min_speedup" and
        "rows"; where it timed nothing, "untimed" (why)."""
        record: dict[str, object] = {"requested": self.requested, "chosen": self.chosen}
        if self.bf16_speedup is not None:
            record["bf16_speedup"] = round(self.bf16_speedup, 2)
            record["bf16_min_speedup"] = BF16_MIN_SPEEDUP
            record["rows"] = self.rows
        elif self.untimed:
            record["untimed"] = self.untimed
        return record


def bf16_decoding_speedup(fp32: Decodable, bf16: Decodable, src: Tensor, beam: int) -> float:
    """float32's time per decoding step over bfloat16's, on the batch `src` at `beam`.

    Each model encodes `src` (untimed), then the two take `TIMED_STEPS` steps in turns
    (`aiayn.training.precision.fastest_seconds`: after one untimed step each; the
    fastest of each counts), on torch's current threads.

    Args:
        fp32, bf16: the same model, frozen in each type, on `src`'s device.
        src: (B, S) source ids, as the translator would batch them.
        beam: hypothesis rows per sentence.

    Returns:
        The ratio; above 1 where bfloat16 steps are faster.
    """
    rows = src.shape[0] * beam
    last = torch.full((rows,), fp32.cfg.bos_id, dtype=torch.long, device=src.device)  # (R,)
    with torch.inference_mode():
        states = [start(model, src, beam) for model in (fp32, bf16)]
        steps = [functools.partial(state.step, last) for state in states]
        fp32_seconds, bf16_seconds = fastest_seconds(steps, TIMED_STEPS, src.device)
    return fp32_seconds / bf16_seconds


def timed_choice(fp32: Decodable, bf16: Decodable, src: Tensor, beam: int) -> PrecisionChoice:
    """`--dtype auto`: bfloat16 where `bf16_decoding_speedup` reaches `BF16_MIN_SPEEDUP`,
    else float32; logged in one line.

    Args:
        fp32, bf16, src, beam: as for `bf16_decoding_speedup`.
    """
    speedup = bf16_decoding_speedup(fp32, bf16, src, beam)
    chosen = "bfloat16" if speedup >= BF16_MIN_SPEEDUP else "float32"
    choice = PrecisionChoice("auto", chosen, speedup, src.shape[0] * beam)
    log.info("%s", choice.line())
    return choice


def untimed_choice(chosen: torch.dtype, why: str) -> PrecisionChoice:
    """`--dtype auto` where nothing is timed (int8 weights, nothing to translate): `chosen`,
    and `why`, logged in one line."""
    choice = PrecisionChoice("auto", str(chosen).removeprefix("torch."), untimed=why)
    log.info("%s", choice.line())
    return choice


def sample_rows(cfg: ModelConfig, sentences: int) -> list[list[int]]:
    """`sentences` rows of `SERVED_SOURCE_TOKENS` ids (eos last; fewer where the model's
    max_len is shorter), to time a server's precision on before any request has come.

    The ids are drawn (seeded) from the vocabulary but the special ones: the time of a
    step does not depend on which tokens it reads.
    """
    length = min(SERVED_SOURCE_TOKENS, cfg.max_len) - 1
    allowed = torch.ones(cfg.vocab_size, dtype=torch.bool)
    allowed[[cfg.pad_id, cfg.bos_id, cfg.eos_id]] = False
    pieces = allowed.nonzero().squeeze(1)  # (V - 3,) the ids a sentence is made of
    generator = torch.Generator().manual_seed(0)
    drawn = torch.randint(len(pieces), (sentences, length), generator=generator)
    return [[*row, cfg.eos_id] for row in pieces[drawn].tolist()]
