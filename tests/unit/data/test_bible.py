"""The Bible corpus: markup cleaning, module reading, alignment and the chapter split."""

from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest
from sword_fixture import CLEAN_EN, CLEAN_ES, MARKUP_EN, chapter_verses

from aiayn.data import bible
from aiayn.data.bible import (
    AlignedBible,
    EnglishSource,
    SwordModuleMissing,
    VerseRef,
    align,
    clean_osis,
    load_bible,
    read_module,
    split_by_chapter,
)


@pytest.mark.parametrize(
    ("markup", "expected"),
    [
        # a footnote between two words leaves one space: no "Godcreated"
        ('<w lemma="strong:H0430">God</w><note>a note</note><w>created</w>', "God created"),
        # ... but none before punctuation
        ("Christ<note>n</note>, the son", "Christ, the son"),
        ("coins</q> <note>n</note> <q>? Not", "coins? Not"),
        # Strong's numbers live in attributes and go with the tags
        ('<w lemma="strong:G2316" morph="x">Dios</w>', "Dios"),
        # back-to-back word elements are separate words (RV1909)
        ("oyeron</w><transChange>estas cosas</transChange><w>todos", "oyeron estas cosas todos"),
        # pilcrows, USFM leftovers, entities, stray whitespace
        ("¶ And \\nd LORD\\+nd* said  &amp;\n  spoke ", "And LORD said & spoke"),
        # headings go, canonical psalm titles stay, poetry lines separate words
        (
            '<title type="x">Heading</title><title canonical="true">A Psalm.</title>'
            '<l sID="1"/>Line one<l eID="1"/><l sID="2"/>line two',
            "A Psalm. Line one line two",
        ),
        # alternative readings and cross references are notes' content
        ('word<note type="crossReference"><rdg type="alternate">alt</rdg></note> end', "word end"),
        # opening punctuation keeps its word: no "( word" or "“ word"
        ("said,<div/>“<w>Let</w>", "said, “Let"),
        ("", ""),
    ],
)
def test_clean_osis_cases(markup, expected):
    assert clean_osis(markup) == expected


def test_clean_osis_fixture_verses():
    for ref, markup in MARKUP_EN.items():
        assert clean_osis(markup) == CLEAN_EN[ref], ref


def test_read_module_cleans_and_keys_by_reference(sword_root):
    english = read_module("engWEB2015eb", "sword-text-web", sword_root)
    spanish = read_module("spaRV1909eb", "sword-text-sparv", sword_root)
    for ref, text in CLEAN_EN.items():
        assert english[ref] == text
    for ref, text in CLEAN_ES.items():
        assert spanish[ref] == text
    plain = chapter_verses(50, 3)
    assert english[("Genesis", 7, 2)] == plain[("Genesis", 7, 2)][0]
    assert english[("Genesis", 2, 3)] == ""  # markup only
    assert english[("Exodus", 1, 1)] == ""  # not in the module at all
    assert len(english) == 31102  # every slot of the KJV versification


def test_missing_module_names_the_apt_get_line(tmp_path, sword_root):
    line = "apt-get install sword-text-web sword-text-sparv sword-text-kjv"
    with pytest.raises(SwordModuleMissing, match=re.escape(line)):
        read_module("engWEB2015eb", "sword-text-web", tmp_path)
    with pytest.raises(SwordModuleMissing, match=re.escape(line)):
        read_module("noSuchModule", "sword-text-web", sword_root)


def test_align_counts_what_it_drops():
    source = {
        ("A", 1, 1): "a",
        ("A", 1, 2): "",
        ("A", 1, 3): "c",
        ("A", 1, 4): "d",
        ("A", 1, 5): "",
    }
    target = {
        ("A", 1, 1): "x",
        ("A", 1, 2): "y",
        ("A", 1, 3): "",
        ("B", 1, 1): "z",
        ("A", 1, 5): "",
    }
    aligned = align(source, target)
    assert aligned.pairs == [("a", "x")]
    assert aligned.refs == [VerseRef(0, "A", 1, 1)]
    assert aligned.dropped == {
        "only_in_source": 1,  # A 1:4
        "only_in_target": 1,  # B 1:1
        "empty_both": 1,  # A 1:5
        "empty_source": 1,  # A 1:2
        "empty_target": 1,  # A 1:3
    }


def test_load_bible_on_the_fixture(sword_root):
    aligned = load_bible(EnglishSource.WEB, sword_root)
    # 150 Genesis verses + John 3:16, less Genesis 2:3 (empty English) and 3:1 (Spanish)
    assert len(aligned.pairs) == 151 - 2
    assert aligned.dropped["empty_source"] == 1
    assert aligned.dropped["empty_target"] == 1
    assert aligned.dropped["empty_both"] == 31102 - 151
    assert aligned.pairs[0] == (CLEAN_EN[("Genesis", 1, 1)], CLEAN_ES[("Genesis", 1, 1)])
    assert aligned.pairs[-1] == (CLEAN_EN[("John", 3, 16)], CLEAN_ES[("John", 3, 16)])


def _refs(chapters_per_book: list[int], verses: int = 5) -> list[VerseRef]:
    return [
        VerseRef(b, f"book{b}", c, v)
        for b, n in enumerate(chapters_per_book)
        for c in range(1, n + 1)
        for v in range(1, verses + 1)
    ]


def test_split_by_chapter_is_deterministic_and_keeps_chapters_whole():
    refs = _refs([50, 40, 30, 150], verses=4)
    splits = split_by_chapter(refs)
    assert splits == split_by_chapter(list(refs))
    by_chapter = collections.defaultdict(set)
    for ref, split in zip(refs, splits, strict=True):
        by_chapter[(ref.book_index, ref.chapter)].add(split)
    assert all(len(s) == 1 for s in by_chapter.values())
    # reference: the k-th chapter in canonical order
    chapters = sorted(by_chapter)
    expected = {
        key: "valid" if k % 97 == 0 else "test" if k % 97 == 48 else "train"
        for k, key in enumerate(chapters)
    }
    assert {key: s.pop() for key, s in by_chapter.items()} == expected
    counts = collections.Counter(splits)
    assert counts == {"valid": 3 * 4, "test": 3 * 4, "train": (270 - 6) * 4}


def test_split_rejects_bad_offsets():
    with pytest.raises(ValueError, match="test_offset"):
        split_by_chapter([], valid_every=10, test_offset=10)


# ----- the real modules ---------------------------------------------------------------

REAL = Path("/usr/share/sword/mods.d")
needs_sword = pytest.mark.skipif(
    not all(
        (REAL / f"{m}.conf").is_file() for m in ("engWEB2015eb", "spaRV1909eb", "engKJV2006eb")
    ),
    reason="Debian SWORD modules absent: " + bible.INSTALL_HINT,
)


@pytest.fixture(scope="module")
def real_web() -> AlignedBible:
    return load_bible(EnglishSource.WEB)


@needs_sword
def test_real_web_and_rv1909(real_web):
    pairs = dict(zip(map(str, real_web.refs), real_web.pairs, strict=True))
    assert len(pairs) > 30_000
    assert pairs["Genesis 1:1"] == (
        "In the beginning, God created the heavens and the earth.",
        "EN el principio crió Dios los cielos y la tierra.",
    )
    assert pairs["John 3:16"][0].startswith(
        "For God so loved the world, that he gave his only born Son,"
    )
    text = " ".join(s + " " + t for s, t in real_web.pairs)
    for bad in ("<", ">", "¶", "strong:", "H0430", "Godcreated", "  ", "\\", "companion glossary"):
        assert bad not in text, bad
    assert not re.search(r"\s[,.;:!?]", text)
    # deuterocanonical books of the WEB have no Spanish counterpart: counted, not lost
    assert real_web.dropped["only_in_source"] > 5000


@needs_sword
def test_real_kjv_has_no_pilcrows_or_usfm():
    aligned = load_bible(EnglishSource.KJV)
    pairs = dict(zip(map(str, aligned.refs), aligned.pairs, strict=True))
    assert pairs["John 3:16"][0] == (
        "For God so loved the world, that he gave his only begotten Son, that whosoever "
        "believeth in him should not perish, but have everlasting life."
    )
    assert pairs["Exodus 17:16"][0].startswith("For he said, Because the LORD hath sworn")
    text = " ".join(s for s, _ in aligned.pairs)
    assert "¶" not in text and "\\" not in text and "<" not in text


def test_find_shifted_chapters_reference():
    from aiayn.data.bible import drop_shifted_chapters, find_shifted_chapters

    lengths = [10, 60, 15, 80, 12, 70, 20, 50]
    refs, pairs = [], []
    for verse, n in enumerate(lengths, start=1):  # chapter 1: aligned, Spanish 20% longer
        refs.append(VerseRef(0, "A", 1, verse))
        pairs.append(("e" * n, "s" * int(n * 1.2)))
    for verse, n in enumerate(lengths, start=1):  # chapter 2: Spanish verse n = English n - 1
        refs.append(VerseRef(0, "A", 2, verse))
        previous = lengths[verse - 2] if verse > 1 else 30
        pairs.append(("e" * n, "s" * int(previous * 1.2)))
    assert find_shifted_chapters(refs, pairs) == {(0, 2)}
    kept = drop_shifted_chapters(AlignedBible(refs, pairs, {"empty_source": 0}))
    assert kept.refs == refs[:8] and kept.pairs == pairs[:8]
    assert kept.dropped == {"empty_source": 0, "shifted_chapter": 8}
    assert kept.shifted_chapters == ["A 2"]


@needs_sword
def test_real_shifted_chapters_are_the_hebrew_numbered_ones(real_web):
    # the RV1909 module numbers these chapters as the Hebrew Bible does
    assert real_web.shifted_chapters == [
        "Hosea 12",
        "I Samuel 24",
        "Jonah 2",
        "Numbers 13",
        "Numbers 30",
    ]
