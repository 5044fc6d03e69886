"""Bible passages labelled by book or genre: every passage is consecutive verses of one
chapter, joined, within the byte range; whole chapters go to one split by the chapter
rule; the genres and the files; bad settings refused by name."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aiayn.cli import app
from aiayn.data.bible_books import (
    CANON,
    GENRES,
    MANIFEST,
    PassageConfig,
    cut_passages,
    write_bible_books,
)
from aiayn.data.classification import read_classes
from aiayn.data.corpus import PreparedCorpus


def verses():
    """Genesis 1-12 and John 1-3 of 9 verses of 20-60 bytes, a deuterocanonical
    book, and empty verses."""
    out = {}
    for book, chapters in (("Genesis", 12), ("Tobit", 2), ("John", 3)):
        for chapter in range(1, chapters + 1):
            for verse in range(1, 10):
                words = " ".join(["word"] * (3 + (chapter * verse) % 9))
                out[book, chapter, verse] = f"{book} {chapter}:{verse}  {words}."
    out["Genesis", 2, 4] = ""
    return out


@pytest.mark.parametrize("labels", ["book", "genre"])
def test_passages_are_consecutive_verses_of_one_chapter_within_the_range(labels):
    given = verses()
    cfg = PassageConfig(min_bytes=60, max_bytes=150, labels=labels, valid_every=4, test_offset=2)
    passages = cut_passages(given, cfg)
    assert passages and {p.book for p in passages} == {"Genesis", "John"}  # no Tobit
    used: set[tuple] = set()
    for p in passages:
        numbers = range(p.first, p.last + 1)
        texts = [" ".join(given[p.book, p.chapter, v].split()) for v in numbers]
        assert p.text == " ".join(t for t in texts if t)  # empty verses left out
        assert 60 <= len(p.text.encode("utf-8")) <= 150
        assert p.label == (p.book if labels == "book" else GENRES[p.book])
        assert not used & {(p.book, p.chapter, v) for v in numbers}  # no verse twice
        used |= {(p.book, p.chapter, v) for v in numbers}
    chapters = [("Genesis", c) for c in range(1, 13)] + [("John", c) for c in range(1, 4)]
    rule = {ch: "valid" if k % 4 == 0 else "test" if k % 4 == 2 else "train"
            for k, ch in enumerate(chapters)}  # fmt: skip
    assert all(p.split == rule[p.book, p.chapter] for p in passages)
    assert {p.split for p in passages} == {"train", "valid", "test"}


def test_the_passage_lengths_come_from_the_seed():
    cfg = PassageConfig(min_bytes=60, max_bytes=150)
    first = cut_passages(verses(), cfg)
    assert cut_passages(verses(), cfg) == first
    other = cut_passages(verses(), PassageConfig(min_bytes=60, max_bytes=150, seed=1))
    assert [p.where for p in other] != [p.where for p in first]


def test_the_canon_and_its_genres():
    assert len(CANON) == len(set(CANON)) == len(GENRES) == 66
    assert len(set(GENRES.values())) == 9
    expected = {
        "Deuteronomy": "law", "Esther": "history", "Song of Solomon": "wisdom",
        "Lamentations": "major prophets", "Daniel": "major prophets",
        "Malachi": "minor prophets", "Acts": "gospels and acts",
        "Philemon": "pauline epistles", "Hebrews": "general epistles",
        "Jude": "general epistles", "Revelation of John": "revelation",
    }  # fmt: skip
    assert {book: GENRES[book] for book in expected} == expected


def test_the_corpus_from_a_sword_module(sword_root, tmp_path):
    cfg = PassageConfig(min_bytes=40, max_bytes=120, valid_every=10, test_offset=5)
    sizes = write_bible_books(tmp_path / "books", cfg, root=sword_root)
    manifest = json.loads((tmp_path / "books" / MANIFEST).read_text())
    assert manifest["sizes"] == sizes and sum(sizes.values()) > 20
    corpus = PreparedCorpus.load(tmp_path / "books")
    assert read_classes(corpus) == manifest["classes"] and manifest["classes"][0] == "Genesis"
    tokenizer = corpus.tokenizer()
    for split, size in sizes.items():
        examples = corpus.read(split)
        places = (tmp_path / "books" / f"{split}.where").read_text().splitlines()
        assert len(examples) == len(places) == size
        for (text, label), where in zip(examples, places, strict=True):
            assert where.startswith(label + " ")
            assert 40 <= len(text.encode("utf-8")) <= 120
    text = corpus.read("train")[0][0]
    assert len(tokenizer.encode(text)) == len(text) + 1  # a character each, and a word start


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"min_bytes": 0}, "min_bytes"),
        ({"min_bytes": 10, "max_bytes": 5}, "max_bytes"),
        ({"labels": "chapter"}, "labels"),
        ({"valid_every": 5, "test_offset": 5}, "test_offset"),
    ],
)
def test_bad_settings_are_refused_by_name(settings, named):
    with pytest.raises(ValueError, match=f"PassageConfig.{named} must"):
        PassageConfig(**settings)


def test_the_command_refuses_bad_labels_in_one_line(tmp_path):
    out = tmp_path / "books"
    result = CliRunner().invoke(
        app, ["prepare", "bible-books", "--out", str(out), "--labels", "verse"]
    )
    assert result.exit_code == 1
    assert result.output.strip() == (
        "aiayn: error: PassageConfig.labels must be book or genre, got 'verse'"
    )
    assert not out.exists()
