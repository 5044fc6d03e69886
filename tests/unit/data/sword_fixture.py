"""A hand-built SWORD module for the data tests: the writer and the verses it holds."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from pysword.books import BibleStructure


def write_ztext_module(
    root: Path, name: str, lang: str, verses: dict[tuple[str, int, int], str]
) -> None:
    """Write a zText SWORD module (KJV versification) holding `verses`, OSIS markup.

    The layout is SWORD's: per testament a `.bzv` index of (block, start, length)
    records, one per versification slot, a `.bzs` index of (offset, size, inflated
    size) per block, and a `.bzz` of zlib-compressed blocks. Verses not given are
    empty. Everything goes into one block per testament.
    """
    structure = BibleStructure("kjv")
    slots: dict[str, dict[int, bytes]] = {"ot": {}, "nt": {}}
    for (book, chapter, verse), markup in verses.items():
        for testament, indices in structure.ref_to_indicies(book, chapter, verse).items():
            slots[testament][indices[0]] = markup.encode("utf-8")
    data_dir = root / "modules" / "texts" / "ztext" / name.lower()
    data_dir.mkdir(parents=True, exist_ok=True)
    for testament, texts in slots.items():
        block, records = b"", []
        for index in range(max(texts, default=0) + 1):
            text = texts.get(index, b"")
            records.append(struct.pack("<IIH", 0, len(block), len(text)))
            block += text
        compressed = zlib.compress(block)
        (data_dir / f"{testament}.bzv").write_bytes(b"".join(records))
        (data_dir / f"{testament}.bzs").write_bytes(
            struct.pack("<III", 0, len(compressed), len(block))
        )
        (data_dir / f"{testament}.bzz").write_bytes(compressed)
    (root / "mods.d").mkdir(parents=True, exist_ok=True)
    (root / "mods.d" / f"{name.lower()}.conf").write_text(
        f"[{name}]\nDataPath=./modules/texts/ztext/{name.lower()}/\nModDrv=zText\n"
        "SourceType=OSIS\nEncoding=UTF-8\nCompressType=ZIP\nBlockType=BOOK\n"
        f"Versification=KJV\nLang={lang}\n",
        encoding="utf-8",
    )


WORDS_EN = [
    "light",
    "water",
    "land",
    "people",
    "king",
    "house",
    "city",
    "word",
    "day",
    "night",
    "son",
    "father",
]
WORDS_ES = [
    "luz",
    "agua",
    "tierra",
    "pueblo",
    "rey",
    "casa",
    "ciudad",
    "palabra",
    "día",
    "noche",
    "hijo",
    "padre",
]


def chapter_verses(chapters: int, per_chapter: int) -> dict[tuple[str, int, int], tuple]:
    """Plain (English, Spanish) sentences for Genesis 1..chapters, distinct per verse."""
    verses = {}
    for c in range(1, chapters + 1):
        for v in range(1, per_chapter + 1):
            k = c * 7 + v
            en = " ".join(WORDS_EN[(k + i) % 12] for i in range(3 + k % 5))
            es = " ".join(WORDS_ES[(k + i) % 12] for i in range(3 + k % 5))
            verses[("Genesis", c, v)] = (f"In {c}:{v} the {en}.", f"En {c}:{v} la {es}.")
    return verses


MARKUP_EN = {
    ("Genesis", 1, 1): (
        '<w lemma="strong:H0430">In</w> <w lemma="strong:H7225">the beginning</w>, '
        '<w lemma="strong:H0430">God</w><note placement="foot"><reference type="annotateRef">'
        "1:1 </reference>The Hebrew word is “Elohim”.</note>"
        '<w lemma="strong:H1254">created</w> the <w lemma="strong:H8064">heavens</w>. '
    ),
    ("Genesis", 1, 2): (
        '<div type="x-milestone" subType="x-preverse" sID="pv1"/><div sID="gen26" type="x-p"/>'
        '¶ The earth was <transChange type="added">formless</transChange>.<l eID="x"/>'
        '<l sID="y"/>Darkness was on the deep. <div eID="gen25" type="x-p"/>'
    ),
    ("Genesis", 1, 3): (
        '<title type="section">The first day</title><title canonical="true" type="psalm">'
        "A Psalm.</title><lg/><l/>God said, “Let there be light,” and there was "
        "\\nd <divineName>LIGHT</divineName>\\+nd* &amp; more"
        '<note type="crossReference"><reference>Jn 1:5</reference></note> . '
    ),
    ("John", 3, 16): (
        '<q marker="" who="Jesus"><w lemma="strong:G1063">For</w> God so loved the world, '
        'that he gave his only born</q><note placement="foot">“only born”</note>'
        '<q marker="" who="Jesus"><w lemma="strong:G5207">Son</w>.</q> '
        '<div sID="g1" type="glossary"/>Abba Abba is a word for father.'
    ),
}
MARKUP_ES = {
    ("Genesis", 1, 1): (
        '<w lemma="strong:H7225">EN el principio</w> <w lemma="strong:H1254">crió</w>'
        '<transChange type="added">Dios</transChange><w lemma="strong:H8064">los cielos</w>.'
    ),
    ("Genesis", 1, 2): "Y la tierra estaba desordenada.",
    ("Genesis", 1, 3): "<w>Y dijo Dios</w>: <w>Sea la luz</w>: ¿y fué la luz?",
    ("John", 3, 16): "Porque de tal manera amó Dios al mundo.",
}
# What the markup above must become; written by hand, not by the cleaner.
CLEAN_EN = {
    ("Genesis", 1, 1): "In the beginning, God created the heavens.",
    ("Genesis", 1, 2): "The earth was formless. Darkness was on the deep.",
    ("Genesis", 1, 3): "A Psalm. God said, “Let there be light,” and there was LIGHT & more.",
    ("John", 3, 16): "For God so loved the world, that he gave his only born Son.",
}
CLEAN_ES = {
    ("Genesis", 1, 1): "EN el principio crió Dios los cielos.",
    ("Genesis", 1, 2): "Y la tierra estaba desordenada.",
    ("Genesis", 1, 3): "Y dijo Dios: Sea la luz: ¿y fué la luz?",
    ("John", 3, 16): "Porque de tal manera amó Dios al mundo.",
}
