"""Tiny corpora and recipes for the training tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

from aiayn.data.prepare import PrepareConfig, prepare_corpus

EN = ["house", "garden", "river", "tree", "stone", "bridge", "light", "water", "night", "summer"]
DE = ["haus", "garten", "fluss", "baum", "stein", "bruecke", "licht", "wasser", "nacht", "sommer"]
RECIPE = Path(__file__).parents[1] / "configs" / "tiny-test.yaml"


def word_pairs(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """`n` pairs translating word for word between two ten-word vocabularies."""
    out = []
    for _ in range(n):
        idx = [rng.randrange(len(EN)) for _ in range(rng.randint(1, 6))]
        out.append((" ".join(EN[i] for i in idx), " ".join(DE[i] for i in idx)))
    return out


def make_corpus(out: Path, train_pairs: int = 200, seed: int = 0) -> Path:
    """A prepared en-de corpus directory with a 40-piece subword model."""
    rng = random.Random(seed)
    splits = {
        "train": word_pairs(train_pairs, rng),
        "valid": word_pairs(12, rng),
        "test": word_pairs(4, rng),
    }
    prepare_corpus(splits, out, "en", "de", PrepareConfig(vocab_size=40))
    return out


def copy_pairs(n: int, rng: random.Random, vocab: int = 13) -> list[tuple[list[int], list[int]]]:
    """The copy task: random id sequences (ids 3..vocab-1, specials excluded), target = source."""
    seqs = [[rng.randrange(3, vocab) for _ in range(rng.randint(4, 10))] for _ in range(n)]
    return [(s, list(s)) for s in seqs]


QUICKSTART_VOCAB = 40  # make_corpus's subword model: the quickstart reuses the corpus it finds


def tiny_quickstart(out: Path, *extra: str) -> tuple[dict, str]:
    """Six steps of the tiny recipe through `aiayn quickstart` (validation at steps 5 and
    6), on `make_corpus`'s corpus in OUT/data; `extra` adds options. Returns results.json
    and the console output."""
    from typer.testing import CliRunner

    from aiayn.cli import app

    if not (out / "data").exists():
        make_corpus(out / "data")
    args = [
        "quickstart", "--out", str(out), "--recipe", str(RECIPE), "--device", "cpu",
        "--vocab-size", str(QUICKSTART_VOCAB), "--minutes", "5", "--test-pairs", "4",
        "--beam", "1", "--set", "train.max_steps=6", "--set", "train.valid_bleu_sentences=0",
        *extra,
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads((out / "results.json").read_text(encoding="utf-8")), result.output
