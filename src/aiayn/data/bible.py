"""The built-in corpus: the Bible, verse-aligned, from Debian's SWORD modules.

English (World English Bible, `sword-text-web`, or King James, `sword-text-kjv`) to
Spanish (Reina-Valera 1909, `sword-text-sparv`), read with `pysword`. The modules store
OSIS markup; `clean_osis` turns one verse of it into plain text. pysword's own cleaner
deletes tags without leaving a space, which glues words around footnotes ("God<note>..
</note>created" becomes "Godcreated"), keeps KJV's pilcrows and USFM leftovers, and drops
the canonical Psalm superscriptions that the Spanish text has inline; hence our own.

Verses are aligned by (book, chapter, verse); the split holds out whole chapters, so no
validation or test verse shares a chapter with training.
"""

from __future__ import annotations

import functools
import html
import logging
import math
import re
import unicodedata
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

log = logging.getLogger(__name__)

SWORD_ROOT = Path("/usr/share/sword")
SWORD_PACKAGES = ("sword-text-web", "sword-text-sparv", "sword-text-kjv")
INSTALL_HINT = "sudo apt-get install " + " ".join(SWORD_PACKAGES)


class EnglishSource(str, Enum):
    """Which English translation is the source side."""

    WEB = "web"  # World English Bible (2015), package sword-text-web
    KJV = "kjv"  # King James Version, package sword-text-kjv


MODULES = {
    EnglishSource.WEB: ("engWEB2015eb", "sword-text-web"),
    EnglishSource.KJV: ("engKJV2006eb", "sword-text-kjv"),
}
SPANISH_MODULE = ("spaRV1909eb", "sword-text-sparv")

# ----- markup -----------------------------------------------------------------------

# Back matter after the last verse of a book (the WEB appends its glossary to
# Revelation 22:21): everything from its opening tag on is not verse text.
_BACK_MATTER = re.compile(
    r"<div\b[^>]*\btype=\"(glossary|introduction|preface|appendix|colophon)\".*",
    re.DOTALL | re.IGNORECASE,
)
# Elements dropped with their content: notes (with the references, catch words and
# alternative readings inside them), speaker labels (Song of Songs in the WEB) and
# non-canonical titles (section headings, the Hebrew letters of Psalm 119, colophons).
_DROP_ELEMENTS = re.compile(
    r"<(note|rdg|catchWord|speaker|figure|index)\b[^>]*?(?<!/)>.*?</\1\s*>"
    r"|<title\b(?![^>]*canonical=\"true\")[^>]*?(?<!/)>.*?</title\s*>",
    re.DOTALL | re.IGNORECASE,
)
# Inline elements: the tags go, the words stay, and no word boundary is implied.
_INLINE_TAGS = re.compile(
    r"</?(w|transChange|divineName|foreign|hi|name|seg|q|reference|mentioned|abbr|"
    r"inscription|salute|signed|rdgGroup|a)\b[^>]*>",
    re.IGNORECASE,
)
# Two word-bearing elements back to back hold separate words: the RV1909 writes
# "<w>como oyeron</w><transChange>estas cosas</transChange><w>todos</w>".
_ADJACENT_WORDS = re.compile(
    r"</(?:w|transChange|divineName)\s*>(?=<(?:w|transChange|divineName)\b)", re.IGNORECASE
)
# Every other tag (paragraphs, poetry lines, milestones, chapters, list items,
# canonical titles' own tags) marks a boundary between words.
_ANY_TAG = re.compile(r"<[^>]*>")
_BOUNDARY = "\x00"
_USFM_MARKER = re.compile(r"\\\+?[a-z]+[0-9]*\*?")  # KJV leftovers: "\nd LORD\+nd*"
_CLOSING = "".join([",", ".", ";", ":", "!", "?", ")", "]", "}", "»", "”", "’", "…"])
_OPENING = "".join(["(", "[", "{", "«", "“", "‘", "¿", "¡"])
_BOUNDARY_BEFORE_CLOSING = re.compile(_BOUNDARY + "+(?=[" + re.escape(_CLOSING) + "])")
_BOUNDARY_AFTER_OPENING = re.compile("(?<=[" + re.escape(_OPENING) + "])" + _BOUNDARY + "+")
_PILCROWS = re.compile("[¶§]")
# Neither English nor Spanish puts a space before these; the WEB sometimes has one
# around a note ("two assaria coins</q> <note>..</note> <q>? Not one").
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+(?=[,.;:!?])")
_SPACES = re.compile(r"\s+")


def clean_osis(markup: str) -> str:
    """Plain text of one verse of OSIS markup.

    Notes, Strong's numbers (tag attributes), alternative readings, headings, back
    matter (a glossary after the last verse) and pilcrows go; canonical Psalm titles stay (the Spanish text has them inline).
    A removed note or structural tag between two words leaves one space, none before
    closing or after opening punctuation. Whitespace is collapsed; the result is NFC.
    """
    text = _BACK_MATTER.sub("", markup)
    text = _DROP_ELEMENTS.sub(_BOUNDARY, text)
    text = _ADJACENT_WORDS.sub(_BOUNDARY, text)
    text = _INLINE_TAGS.sub("", text)
    text = _ANY_TAG.sub(_BOUNDARY, text)
    text = html.unescape(text)
    text = _USFM_MARKER.sub("", text)
    text = _PILCROWS.sub(" ", text)
    text = _BOUNDARY_BEFORE_CLOSING.sub("", text)
    text = _BOUNDARY_AFTER_OPENING.sub("", text)
    text = text.replace(_BOUNDARY, " ")
    text = _SPACES.sub(" ", text)
    text = _SPACE_BEFORE_PUNCTUATION.sub("", text).strip()
    return unicodedata.normalize("NFC", text)


# ----- reading modules --------------------------------------------------------------


@dataclass(frozen=True, order=True)
class VerseRef:
    """A location: book order in the canon, book name, chapter and verse."""

    book_index: int
    book: str
    chapter: int
    verse: int

    def __str__(self) -> str:
        return f"{self.book} {self.chapter}:{self.verse}"


class SwordModuleMissing(FileNotFoundError):
    """A SWORD module is not installed; the message says how to install it."""


def read_module(module: str, package: str, root: Path = SWORD_ROOT) -> dict[tuple, str]:
    """Cleaned verses of one installed module, keyed by (book, chapter, verse).

    Args:
        module: the module's name in `root/mods.d/*.conf`, e.g. "engWEB2015eb".
        package: the Debian package that installs it, for the error message.
        root: the SWORD data path.

    Returns:
        {(book name, chapter, verse): text} in canonical order, empty verses included
        (as ""), and the raw markup is not kept.

    Raises:
        SwordModuleMissing: the module is not installed under `root`.
    """
    from pysword.modules import SwordModules

    if not (root / "mods.d").is_dir():
        raise SwordModuleMissing(
            f"no SWORD modules under {root} (module {module} of package {package}); "
            f"install them with: {INSTALL_HINT}"
        )
    modules = SwordModules(str(root))
    found = modules.parse_modules()
    if module not in found:
        raise SwordModuleMissing(
            f"SWORD module {module} (package {package}) is not installed under {root}; "
            f"install it with: {INSTALL_HINT}"
        )
    bible = modules.get_bible_from_module(module)
    # pysword inflates a whole compressed book for every verse it reads; remembering the
    # last few blocks makes reading a Bible take a second instead of a minute.
    if hasattr(bible, "_decompressed_text"):
        bible._decompressed_text = functools.lru_cache(maxsize=8)(bible._decompressed_text)
    verses: dict[tuple, str] = {}
    for books in bible.get_structure().get_books().values():
        for book in books:
            for chapter, n_verses in enumerate(book.chapter_lengths, start=1):
                numbers = list(range(1, n_verses + 1))
                try:
                    texts = list(bible.get_iter(book.name, chapter, numbers, clean=False))
                except (OSError, ValueError, zlib.error) as err:
                    raise ValueError(
                        f"{module}: cannot read {book.name} {chapter}: {err}"
                    ) from None
                if len(texts) != len(numbers):
                    raise ValueError(
                        f"{module}: {book.name} {chapter} has {len(numbers)} verses in its "
                        f"versification but {len(texts)} were read"
                    )
                for verse, markup in zip(numbers, texts, strict=True):
                    verses[(book.name, chapter, verse)] = clean_osis(markup)
    log.info("read %d verses from SWORD module %s", len(verses), module)
    return verses


# ----- alignment and split ----------------------------------------------------------


@dataclass
class AlignedBible:
    """Verse pairs in canonical order, with what alignment dropped."""

    refs: list[VerseRef]
    pairs: list[tuple[str, str]]
    dropped: dict[str, int]
    shifted_chapters: list[str] = field(default_factory=list)


def align(source: dict[tuple, str], target: dict[tuple, str]) -> AlignedBible:
    """Pair verses present in both texts, in the source's order.

    Verses only one side has (different versifications, deuterocanonical books)
    and verses empty on either side (or both: slots of the versification a text
    leaves empty) are dropped and counted.
    """
    dropped = {
        "only_in_source": 0,
        "only_in_target": 0,
        "empty_both": 0,
        "empty_source": 0,
        "empty_target": 0,
    }
    book_order: dict[str, int] = {}
    refs: list[VerseRef] = []
    pairs: list[tuple[str, str]] = []
    for key, src in source.items():
        if key not in target:
            dropped["only_in_source"] += 1
            continue
        tgt = target[key]
        if not src and not tgt:
            dropped["empty_both"] += 1
            continue
        if not src:
            dropped["empty_source"] += 1
            continue
        if not tgt:
            dropped["empty_target"] += 1
            continue
        book, chapter, verse = key
        index = book_order.setdefault(book, len(book_order))
        refs.append(VerseRef(index, book, chapter, verse))
        pairs.append((src, tgt))
    dropped["only_in_target"] = sum(1 for key in target if key not in source)
    return AlignedBible(refs, pairs, dropped)


def split_by_chapter(
    refs: Sequence[VerseRef], valid_every: int = 97, test_offset: int = 48
) -> list[str]:
    """Assign every verse to "train", "valid" or "test" by its chapter.

    Chapters are numbered in canonical order (0, 1, ...); chapter k goes to valid
    when k % valid_every == 0, to test when k % valid_every == test_offset, to train
    otherwise. With the 1,189 Protestant chapters and the defaults that is 13 chapters
    each (a few hundred verses), spread over both testaments. Deterministic: the
    split depends only on the locations.
    """
    if not 0 < test_offset < valid_every:
        raise ValueError(
            f"test_offset must lie in (0, valid_every={valid_every}), got {test_offset}"
        )
    chapter_index: dict[tuple[int, int], int] = {}
    splits = []
    for ref in refs:
        k = chapter_index.setdefault((ref.book_index, ref.chapter), len(chapter_index))
        if k % valid_every == 0:
            splits.append("valid")
        elif k % valid_every == test_offset:
            splits.append("test")
        else:
            splits.append("train")
    return splits


def _mean_log_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(abs(math.log(x / y)) for x, y in zip(a, b, strict=True)) / len(a)


def find_shifted_chapters(
    refs: Sequence[VerseRef],
    pairs: Sequence[tuple[str, str]],
    min_verses: int = 4,
    min_error: float = 0.25,
    gain: float = 0.6,
) -> set[tuple[int, int]]:
    """Chapters whose verses look numbered one apart in the two texts.

    The RV1909 module numbers a few chapters the Hebrew way (Numbers 13 and 30,
    1 Samuel 24, Hosea 12, Jonah 2: its verse n is the English verse n - 1), so
    pairing by number puts every verse beside its neighbour's translation. Such a
    chapter shows in the sentence lengths: after scaling English lengths to the
    Spanish total, the mean |log(length ratio)| of the pairs is at least
    `min_error`, and shifting one side by one verse cuts it by the factor `gain`.

    Returns:
        {(book_index, chapter)} of the shifted chapters.
    """
    chapters: dict[tuple[int, int], list[int]] = {}
    for i, ref in enumerate(refs):
        chapters.setdefault((ref.book_index, ref.chapter), []).append(i)
    shifted = set()
    for key, indices in chapters.items():
        if len(indices) < min_verses:
            continue
        src = [len(pairs[i][0]) for i in indices]
        tgt = [float(len(pairs[i][1])) for i in indices]
        scale = sum(tgt) / sum(src)
        src = [n * scale for n in src]
        error = _mean_log_ratio(src, tgt)
        best_shift = min(_mean_log_ratio(src[1:], tgt[:-1]), _mean_log_ratio(src[:-1], tgt[1:]))
        if error >= min_error and best_shift < gain * error:
            shifted.add(key)
    return shifted


def drop_shifted_chapters(aligned: AlignedBible) -> AlignedBible:
    """`aligned` without the chapters `find_shifted_chapters` flags; counted and named."""
    shifted = find_shifted_chapters(aligned.refs, aligned.pairs)
    keep = [i for i, r in enumerate(aligned.refs) if (r.book_index, r.chapter) not in shifted]
    names = sorted(
        {f"{r.book} {r.chapter}" for r in aligned.refs if (r.book_index, r.chapter) in shifted}
    )
    dropped = {**aligned.dropped, "shifted_chapter": len(aligned.refs) - len(keep)}
    if names:
        log.info("dropped %d chapters numbered one verse apart: %s", len(names), ", ".join(names))
    return AlignedBible(
        [aligned.refs[i] for i in keep], [aligned.pairs[i] for i in keep], dropped, names
    )


def load_bible(source: EnglishSource = EnglishSource.WEB, root: Path = SWORD_ROOT) -> AlignedBible:
    """Read, clean and align English `source` with the Spanish Reina-Valera 1909.

    Chapters numbered one verse apart in the two modules are dropped (see
    `find_shifted_chapters`) and counted as "shifted_chapter" pairs.

    Raises:
        SwordModuleMissing: a module is not installed; the message has the apt-get line.
    """
    module, package = MODULES[EnglishSource(source)]
    english = read_module(module, package, root)
    spanish = read_module(*SPANISH_MODULE, root=root)
    return drop_shifted_chapters(align(english, spanish))
