"""Repeated random tokens: a language-modelling corpus where only copying from context helps.

Each document (line) is T symbols drawn uniformly at random, then the same T again:

    q7Rk2Wq7Rk2W        (T = 6; T is drawn per line from [min_length, max_length])

The first half cannot be predicted better than chance (ln of the alphabet's size, in
nats per token); the second half can be predicted exactly, but only by a model that
finds the earlier occurrence of the current symbol and copies the symbol after it:
an induction head (Olsson et al. 2022, "In-context Learning and Induction Heads",
whose small models are trained on such sequences). T varies from line to line, so
no fixed offset ("attend T - 1 back") solves the task: the model has to match content.

With `line_length` set, every line holds exactly that many symbols: random filler
before and after the repeated pair, which starts at a random offset,

    Xa9q7Rk2Wq7Rk2WcB3    (line_length 18: filler "Xa9", T = 6, filler "cB3")

so that a recipe whose blocks are as long as a line with its marker and eos
(`max_len = line_length + 2`) gets one line per block: packing puts no unrelated
line before it, whose symbols an induction head would match too. With
`repeat_to_fill` the line holds no random filler: the T symbols repeat until it is full,

    q7Rk2Wq7Rk2Wq7Rk2Wq7    (line_length 20, T = 6)

so only the first T symbols are unpredictable, as in a sequence and its copy, and
every later one can be copied. Random filler leaves two thirds of a line of 62
unpredictable, and a model trained on it left the plateau far later
(benchmarks/results/induction-causes-repeated.json).

`prepare_lm_repeated` writes the lines as a monolingual corpus
(`aiayn.data.lm.prepare_monolingual`, language code "rnd") with a character-level
subword model: every symbol is one id, and sentencepiece puts its word marker "▁" in
front of each line. `aiayn train` packs the lines, each followed by eos, into blocks
as it does any text (`aiayn.data.lm.pack`). `symbol_ids` gives the ids of the
alphabet, the tokens the test sequences of `aiayn.analysis.induction` should use.
"""

from __future__ import annotations

import logging
import random
import string
from dataclasses import asdict, dataclass
from pathlib import Path

from aiayn.data.corpus import SPLITS, PreparedCorpus
from aiayn.data.lm import prepare_monolingual
from aiayn.data.prepare import PrepareConfig
from aiayn.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)

ALPHABET = string.ascii_letters + string.digits  # 62 symbols, each one character
LANG = "rnd"  # the corpus files' suffix: train.rnd, valid.rnd, test.rnd
SPECIAL_PIECES = 8  # pad, bos, eos, unk, [CLS], [SEP], [MASK] and the word marker "▁"


@dataclass(frozen=True)
class RepeatedConfig:
    """How a repeated-random-token corpus is drawn.

    Args:
        n_symbols: the alphabet's size, the first n of `ALPHABET` (2 ... 62).
        min_length, max_length: T, the symbols of one half, is drawn uniformly from
            [min_length, max_length] for each line.
        lines: documents per split ("train", "valid", "test").
        seed: the random seed; the same settings give the same lines.
        line_length: every line this many symbols, random filler around the repeated
            pair (None: a line is the pair alone); at least 2 * min_length. T is then
            drawn from [min_length, min(max_length, line_length // 2)].
        repeat_to_fill: with `line_length`, fill the line with further copies of the
            T symbols (cut at the line's end) instead of random filler.

    Raises:
        ValueError: a setting out of range, naming it.
    """

    n_symbols: int = 62
    min_length: int = 8
    max_length: int = 48
    lines: tuple[int, int, int] = (40_000, 200, 200)
    seed: int = 0
    line_length: int | None = None
    repeat_to_fill: bool = False

    def __post_init__(self) -> None:
        if not 2 <= self.n_symbols <= len(ALPHABET):
            raise ValueError(
                f"RepeatedConfig.n_symbols must lie in [2, {len(ALPHABET)}], got {self.n_symbols}"
            )
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(
                "RepeatedConfig needs 1 <= min_length <= max_length, got "
                f"{self.min_length} and {self.max_length}"
            )
        if self.line_length is not None and self.line_length < 2 * self.min_length:
            raise ValueError(
                f"RepeatedConfig.line_length must be at least 2 * min_length = "
                f"{2 * self.min_length}, got {self.line_length}"
            )
        if self.repeat_to_fill and self.line_length is None:
            raise ValueError("RepeatedConfig.repeat_to_fill needs a line_length to fill")
        if len(self.lines) != len(SPLITS) or self.lines[0] < 1 or min(self.lines) < 0:
            raise ValueError(
                f"RepeatedConfig.lines must be {len(SPLITS)} counts (train >= 1), got {self.lines}"
            )

    @property
    def alphabet(self) -> str:
        """The symbols drawn from."""
        return ALPHABET[: self.n_symbols]


def draw_line(rng: random.Random, cfg: RepeatedConfig) -> str:
    """One document: T random symbols, then the same T again (with `cfg.line_length`,
    inside random filler up to that length, or with `cfg.repeat_to_fill` repeated to it)."""
    if cfg.line_length is None:
        length = rng.randint(cfg.min_length, cfg.max_length)
        half = "".join(rng.choices(cfg.alphabet, k=length))
        return half + half
    length = rng.randint(cfg.min_length, min(cfg.max_length, cfg.line_length // 2))
    half = "".join(rng.choices(cfg.alphabet, k=length))
    if cfg.repeat_to_fill:
        return (half * (cfg.line_length // length + 1))[: cfg.line_length]
    before = rng.randint(0, cfg.line_length - 2 * length)
    filler = "".join(rng.choices(cfg.alphabet, k=cfg.line_length - 2 * length))
    return filler[:before] + half + half + filler[before:]


def draw_lines(cfg: RepeatedConfig) -> dict[str, list[str]]:
    """Each split's documents (`RepeatedConfig.lines` of them), from one generator seeded
    by `cfg.seed`: train first, then valid, then test."""
    rng = random.Random(cfg.seed)
    return {
        name: [draw_line(rng, cfg) for _ in range(count)]
        for name, count in zip(SPLITS, cfg.lines, strict=True)
    }


def prepare_lm_repeated(out: str | Path, cfg: RepeatedConfig | None = None) -> PreparedCorpus:
    """Draw the documents and write them as a monolingual corpus in `out`.

    The subword model is character-level with room for every symbol, so each symbol
    is one id (`symbol_ids`); stats.json records the settings as the source.

    Args:
        out: the corpus directory (created).
        cfg: the settings (default `RepeatedConfig()`).

    Returns:
        The written corpus.
    """
    cfg = cfg or RepeatedConfig()
    splits = draw_lines(cfg)
    source = {"kind": "repeated random tokens", **asdict(cfg)}
    config = PrepareConfig(vocab_size=SPECIAL_PIECES + cfg.n_symbols, model_type="char")
    corpus = prepare_monolingual(splits, out, LANG, config, source)
    log.info("wrote %d lines of repeated random symbols to %s", sum(cfg.lines), out)
    return corpus


WORD_MARKER = "\u2581"  # sentencepiece's "▁", the first piece of every line


def line_start_id(tokenizer: Tokenizer) -> int:
    """The id of the word marker "▁" that begins every line of the corpus: the first
    input of a block that holds one line (`RepeatedConfig.line_length`).

    Raises:
        ValueError: the tokenizer has no such piece (not a repeated corpus's).
    """
    for token_id in range(tokenizer.vocab_size):
        if tokenizer.id_to_piece(token_id) == WORD_MARKER:
            return token_id
    raise ValueError(f"the tokenizer has no piece {WORD_MARKER!r}: not a repeated corpus's")


def symbol_ids(tokenizer: Tokenizer) -> list[int]:
    """The ids of the alphabet's symbols in `tokenizer`, in id order: every piece that is
    one character of `ALPHABET` (not the specials, "[CLS]"... or the word marker)."""
    return [
        token_id
        for token_id in range(tokenizer.vocab_size)
        if (piece := tokenizer.id_to_piece(token_id)) in ALPHABET and len(piece) == 1
    ]
