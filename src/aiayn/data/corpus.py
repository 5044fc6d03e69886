"""Parallel corpora on disk: reading aligned files, and a prepared corpus directory.

A prepared directory (written by `aiayn prepare ...`, see `aiayn.data.prepare`) holds

    train.{src} train.{tgt} valid.{src} valid.{tgt} test.{src} test.{tgt}
        one sentence per line, line i of one language aligned with line i of the other
    spm.model    the shared sentencepiece model
    stats.json   pairs and tokens per split, what was dropped and why, the settings
    corpus.json  languages and file names; `PreparedCorpus.load` reads it
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from aiayn.data.files import (
    read_lines,
    write_atomic,  # noqa: F401 (re-exported until its callers move)
)
from aiayn.data.tokenizer import SentencePieceTokenizer

SPLITS = ("train", "valid", "test")
CORPUS_FILE = "corpus.json"
STATS_FILE = "stats.json"


# ----- reading ----------------------------------------------------------------------


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> list[tuple[str, str]]:
    """(source, target) pairs from two aligned files, one sentence per line.

    Raises:
        ValueError: the files have different line counts (both files and counts are
            named), or one holds invalid UTF-8 (file and line are named).
    """
    src_lines = read_lines(src_path)
    tgt_lines = read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise ValueError(
            f"parallel files differ in length: {src_path} has {len(src_lines)} lines, "
            f"{tgt_path} has {len(tgt_lines)}"
        )
    return list(zip(src_lines, tgt_lines, strict=True))


def read_tsv(path: str | Path) -> list[tuple[str, str]]:
    """(source, target) pairs from a file of two tab-separated columns.

    Raises:
        ValueError: a line without exactly two columns, or invalid UTF-8 (file and
            line are named).
    """
    pairs = []
    for number, line in enumerate(read_lines(path), start=1):
        columns = line.split("\t")
        if len(columns) != 2:
            raise ValueError(
                f"{path}:{number}: expected 2 tab-separated columns, found {len(columns)}"
            )
        pairs.append((columns[0], columns[1]))
    return pairs


# ----- a prepared corpus ------------------------------------------------------------


@dataclass(frozen=True)
class PreparedCorpus:
    """A directory written by `aiayn prepare`: aligned splits and a subword model.

    Attributes:
        root: the directory.
        src_lang: source language code, the suffix of the source files ("en").
        tgt_lang: target language code ("es").
        tokenizer_path: the shared sentencepiece model.
    """

    root: Path
    src_lang: str
    tgt_lang: str
    tokenizer_path: Path

    @classmethod
    def load(cls, directory: str | Path) -> PreparedCorpus:
        """Read `directory/corpus.json`.

        Raises:
            FileNotFoundError: no corpus.json (the directory was not prepared).
            ValueError: corpus.json is not valid or lacks a field.
        """
        root = Path(directory)
        path = root / CORPUS_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: prepare the corpus first (aiayn prepare ... --out {root})"
            )
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                root=root,
                src_lang=meta["src_lang"],
                tgt_lang=meta["tgt_lang"],
                tokenizer_path=root / meta["tokenizer"],
            )
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{path} is not a valid corpus description: {err!r}") from None

    def files(self, split: str) -> tuple[Path, Path]:
        """The (source, target) files of `split` ("train", "valid" or "test")."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return (self.root / f"{split}.{self.src_lang}", self.root / f"{split}.{self.tgt_lang}")

    def read(self, split: str) -> list[tuple[str, str]]:
        """The (source, target) sentence pairs of `split`."""
        return read_parallel(*self.files(split))

    @property
    def stats(self) -> dict:
        """The contents of stats.json."""
        return json.loads((self.root / STATS_FILE).read_text(encoding="utf-8"))

    def tokenizer(self) -> SentencePieceTokenizer:
        """The shared subword model."""
        return SentencePieceTokenizer.load(self.tokenizer_path)
