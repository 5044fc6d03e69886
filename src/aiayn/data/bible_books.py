"""Which book of the Bible a passage comes from: byte-level text classification on a long
input, as Long Range Arena's "Text" task (Tay et al. 2021, section 3.2) asks of a model,
with a corpus aiayn reads offline (`aiayn.data.bible`).

A passage is consecutive verses of one chapter of the English Bible (the World English
Bible by default), joined by spaces, between `min_bytes` and `max_bytes` UTF-8 bytes
(1-4 KB: a model reading bytes sees 1,000-4,000 positions). Each chapter is cut into
passages of a length drawn from that range (a fixed seed), at verse boundaries; a
chapter's tail shorter than `min_bytes` is dropped. The label is the book, one of the
66 of the Protestant canon (`CANON`; deuterocanonical books are left out), or, as an
easier task, its genre (`GENRES`: law, history, ... revelation, 9 classes).

The data set is a classification corpus (`aiayn.data.classification`) with a
character-level tokenizer: one id per character (LRA reads bytes; the English text is
nearly all ASCII, where the two agree). Passages are held out by chapter: `aiayn.data.bible.split_by_chapter` assigns whole
chapters to training, validation or test, as the translation corpus does (here one
chapter in 10 each for validation and test by default, since passages are few: a
chapter gives one to a few), so no validation or test passage shares a chapter with a
training one.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

from aiayn.data.bible import (
    MODULES,
    SWORD_ROOT,
    EnglishSource,
    VerseRef,
    read_module,
    split_by_chapter,
)
from aiayn.data.classification import write_classification_corpus
from aiayn.data.files import lines_text, write_dir_atomic

log = logging.getLogger(__name__)

# The 66 books, in canonical order, as the SWORD modules name them.
CANON: tuple[str, ...] = (
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy",
    "Joshua", "Judges", "Ruth", "I Samuel", "II Samuel", "I Kings", "II Kings",
    "I Chronicles", "II Chronicles", "Ezra", "Nehemiah", "Esther",
    "Job", "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon",
    "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel",
    "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk",
    "Zephaniah", "Haggai", "Zechariah", "Malachi",
    "Matthew", "Mark", "Luke", "John", "Acts",
    "Romans", "I Corinthians", "II Corinthians", "Galatians", "Ephesians", "Philippians",
    "Colossians", "I Thessalonians", "II Thessalonians", "I Timothy", "II Timothy", "Titus",
    "Philemon",
    "Hebrews", "James", "I Peter", "II Peter", "I John", "II John", "III John", "Jude",
    "Revelation of John",
)  # fmt: skip
# Genres, each the next run of books of `CANON`: (name, books).
GENRE_RUNS = (
    ("law", 5),
    ("history", 12),
    ("wisdom", 5),
    ("major prophets", 5),
    ("minor prophets", 12),
    ("gospels and acts", 5),
    ("pauline epistles", 13),
    ("general epistles", 8),
    ("revelation", 1),
)
GENRES: dict[str, str] = {}  # book -> genre
_books = iter(CANON)
for _genre, _count in GENRE_RUNS:
    GENRES.update({next(_books): _genre for _ in range(_count)})
MANIFEST = "bible-books.json"
_SPACES = re.compile(r"\s+")


class Labels(str, Enum):
    """What a passage is labelled with."""

    BOOK = "book"  # 66 classes
    GENRE = "genre"  # 9 classes (`GENRE_RUNS`)


@dataclass(frozen=True)
class PassageConfig:
    """How passages are cut and labelled.

    Args:
        min_bytes: the shortest passage, in UTF-8 bytes (>= 1).
        max_bytes: the longest passage (>= min_bytes).
        labels: the book or its genre.
        seed: the seed of the passage lengths.
        valid_every, test_offset: the chapter split (`aiayn.data.bible.split_by_chapter`).

    Raises:
        ValueError: a setting out of range, naming it.
    """

    min_bytes: int = 1024
    max_bytes: int = 4096
    labels: Labels = Labels.BOOK
    seed: int = 0
    valid_every: int = 10
    test_offset: int = 5

    def __post_init__(self) -> None:
        if self.min_bytes < 1:
            raise ValueError(f"PassageConfig.min_bytes must be >= 1, got {self.min_bytes}")
        if self.max_bytes < self.min_bytes:
            raise ValueError(
                f"PassageConfig.max_bytes must be >= min_bytes ({self.min_bytes}), "
                f"got {self.max_bytes}"
            )
        try:
            object.__setattr__(self, "labels", Labels(self.labels))
        except ValueError:
            raise ValueError(
                f"PassageConfig.labels must be book or genre, got {self.labels!r}"
            ) from None
        if not 0 < self.test_offset < self.valid_every:
            raise ValueError(
                f"PassageConfig.test_offset must lie in (0, valid_every={self.valid_every}), "
                f"got {self.test_offset}"
            )


@dataclass(frozen=True)
class Passage:
    """Verses `first` ... `last` of one chapter, joined, with its label and split."""

    text: str
    label: str
    book: str
    chapter: int
    first: int
    last: int
    split: str

    @property
    def where(self) -> str:
        return f"{self.book} {self.chapter}:{self.first}-{self.last}"


def cut_passages(verses: Mapping[tuple[str, int, int], str], cfg: PassageConfig) -> list[Passage]:
    """The passages of a Bible's verses (see the module docstring), in canonical order.

    Args:
        verses: {(book, chapter, verse): text}, as `aiayn.data.bible.read_module` reads
            them; books outside `CANON` and empty verses are left out.
        cfg: the settings.

    Returns:
        Every passage, each with its split.
    """
    chapters: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for (book, chapter, verse), text in verses.items():
        text = _SPACES.sub(" ", text).strip()
        if book in GENRES and text:
            chapters.setdefault((book, chapter), []).append((verse, text))
    order = sorted(chapters, key=lambda key: (CANON.index(key[0]), key[1]))
    first_verses = [VerseRef(CANON.index(b), b, c, chapters[b, c][0][0]) for b, c in order]
    splits = split_by_chapter(first_verses, cfg.valid_every, cfg.test_offset)
    rng = random.Random(cfg.seed)
    out: list[Passage] = []
    for (book, chapter), split in zip(order, splits, strict=True):
        label = book if cfg.labels is Labels.BOOK else GENRES[book]
        for run in _runs(sorted(chapters[book, chapter]), cfg, rng):
            text = " ".join(text for _, text in run)
            out.append(Passage(text, label, book, chapter, run[0][0], run[-1][0], split))
    return out


def _runs(
    verses: Sequence[tuple[int, str]], cfg: PassageConfig, rng: random.Random
) -> list[list[tuple[int, str]]]:
    """One chapter's verses cut into runs of `cfg.min_bytes` ... `cfg.max_bytes` bytes
    joined, each closed once it reaches a length drawn from that range (or when the
    next verse would not fit); a shorter run is dropped."""
    runs: list[list[tuple[int, str]]] = []

    def close(run: list[tuple[int, str]], size: int) -> int:
        if run and size >= cfg.min_bytes:
            runs.append(run)
        return rng.randint(cfg.min_bytes, cfg.max_bytes)

    run: list[tuple[int, str]] = []
    size, target = 0, close([], 0)
    for verse, text in verses:
        added = len(text.encode("utf-8")) + (1 if run else 0)  # the joining space
        if run and size + added > cfg.max_bytes:  # the verse would not fit
            target = close(run, size)
            run, size, added = [], 0, added - 1
        if added > cfg.max_bytes:
            continue  # one verse longer than a passage may be
        run.append((verse, text))
        size += added
        if size >= target:
            target = close(run, size)
            run, size = [], 0
    close(run, size)
    return runs


def write_bible_books(
    out: str | Path,
    cfg: PassageConfig | None = None,
    source: EnglishSource = EnglishSource.WEB,
    root: Path = SWORD_ROOT,
) -> dict[str, int]:
    """Cut the English Bible into labelled passages and write them into directory `out`.

    Writes a classification corpus (`aiayn.data.classification`: each split's passages
    and labels, a character-level sentencepiece model), each split's verses
    ({split}.where: "Genesis 1:1-20" per line) and `MANIFEST` (settings, sizes, the
    label set), all at once (`aiayn.data.files.write_dir_atomic`).

    Args:
        out: the directory.
        cfg: the settings (default: 1-4 KB passages labelled by book).
        source: the English translation.
        root: the SWORD data path.

    Returns:
        Passages per split.

    Raises:
        aiayn.data.bible.SwordModuleMissing: the translation is not installed.
    """
    cfg = PassageConfig() if cfg is None else cfg
    passages = cut_passages(read_module(*MODULES[source], root=root), cfg)
    by_split: dict[str, list[Passage]] = {"train": [], "valid": [], "test": []}
    for passage in passages:
        by_split[passage.split].append(passage)
    sizes = {name: len(rows) for name, rows in by_split.items()}
    classes = sorted({p.label for p in passages}, key=_label_order(cfg.labels))

    def fill(tmp: Path) -> None:
        examples = {name: [(p.text, p.label) for p in rows] for name, rows in by_split.items()}
        # characters: a few dozen in English, each its own piece (the vocabulary size is
        # an upper bound for sentencepiece's character model)
        write_classification_corpus(tmp, examples, classes, "char", 1024, seed=cfg.seed)
        for name, rows in by_split.items():
            (tmp / f"{name}.where").write_text(lines_text(p.where for p in rows), "utf-8")
        settings = {**asdict(cfg), "labels": cfg.labels.value, "source": source.value}
        record = {"settings": settings, "sizes": sizes, "classes": classes}
        (tmp / MANIFEST).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    write_dir_atomic(out, fill)
    log.info("wrote %s Bible passages to %s", sizes, out)
    return sizes


def _label_order(labels: Labels):
    if labels is Labels.BOOK:
        return CANON.index
    genres = [name for name, _ in GENRE_RUNS]
    return genres.index
