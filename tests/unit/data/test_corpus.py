"""Reading parallel files, bad input, and prepared corpus directories."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from aiayn.config import ModelConfig
from aiayn.data.corpus import PreparedCorpus, read_parallel, read_tsv
from aiayn.data.prepare import (
    PrepareConfig,
    drop_empty,
    length_filter,
    prepare_bible,
    prepare_hf,
    prepare_text,
    prepare_tsv,
)

EN = [
    "the",
    "cat",
    "sat",
    "on",
    "the",
    "mat",
    "and",
    "the",
    "dog",
    "ran",
    "to",
    "the",
    "house",
    "near",
    "the",
    "river",
    "bank",
]
DE = [
    "die",
    "Katze",
    "sass",
    "auf",
    "der",
    "Matte",
    "und",
    "der",
    "Hund",
    "lief",
    "zum",
    "Haus",
    "nahe",
    "am",
    "Flussufer",
]


def sentences(n: int, words: list[str], offset: int = 0) -> list[str]:
    return [
        " ".join(words[(i + j) % len(words)] for j in range(3 + i % 6))
        for i in range(offset, offset + n)
    ]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


SMALL = PrepareConfig(vocab_size=60, max_tokens=40, max_ratio=3.0)
LOOSE = PrepareConfig(vocab_size=60, max_tokens=500, max_ratio=50.0)  # keeps every pair


# ----- reading and bad input ----------------------------------------------------------


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    src = write_lines(tmp_path / "train.en", ["a", "b", "c"])
    tgt = write_lines(tmp_path / "train.de", ["x", "y"])
    with pytest.raises(ValueError) as info:
        read_parallel(src, tgt)
    message = str(info.value)
    assert str(src) in message and str(tgt) in message
    assert "3 lines" in message and "has 2" in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad.de"
    path.write_bytes(b"gut\nauch gut\nschlecht \xff\xfe hier\n")
    src = write_lines(tmp_path / "ok.en", ["a", "b", "c"])
    with pytest.raises(ValueError, match=re.escape(f"{path}:3:")):
        read_parallel(src, path)


def test_tsv_needs_two_columns(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("a\tb\nc\td\te\n", encoding="utf-8")
    with pytest.raises(
        ValueError, match=re.escape(f"{path}:2: expected 2 tab-separated columns, found 3")
    ):
        read_tsv(path)
    path.write_text("a\tb\n\t\n", encoding="utf-8")
    assert read_tsv(path) == [("a", "b"), ("", "")]


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        read_parallel(tmp_path / "nope", tmp_path / "nope")


def test_drop_empty_counts_whitespace_pairs():
    pairs = [("a", "b"), ("  ", "x"), ("y", "\t"), (" c ", " d "), ("", ""), ("e\nf", "g\r\nh")]
    assert drop_empty(pairs) == ([("a", "b"), ("c", "d"), ("e f", "g  h")], 3)


def test_length_filter_reference():
    config = PrepareConfig(max_tokens=10, max_ratio=2.0, ratio_min_tokens=3)
    lengths = [(10, 10), (11, 3), (3, 11), (4, 8), (4, 9), (1, 9), (2, 2)]
    keep, dropped = length_filter([s for s, _ in lengths], [t for _, t in lengths], config)
    # (11, 3), (3, 11): too long; (4, 9): ratio 2.25; (1, 9): exempt, shorter side < 3
    assert keep == [0, 3, 5, 6]
    assert dropped == {"too_long": 2, "length_ratio": 1}


# ----- prepare ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory) -> tuple[PreparedCorpus, dict]:
    """A prepared corpus with some empty, too long and badly proportioned pairs."""
    tmp = tmp_path_factory.mktemp("text")
    src, tgt = sentences(300, EN), sentences(300, DE)
    bad = {
        "empty": [("", "nicht leer"), ("   ", "x"), ("not empty", " \t ")],
        "too_long": [
            (" ".join(EN * 6), "kurz und klein hier"),
            ("short one here", " ".join(DE * 6)),
        ],
        "length_ratio": [("the cat sat", " ".join(DE[:14]))],
    }
    for pairs in bad.values():
        for s, t in pairs:
            src.append(s)
            tgt.append(t)
    files = {
        "train": (write_lines(tmp / "tr.en", src), write_lines(tmp / "tr.de", tgt)),
        "valid": (
            write_lines(tmp / "va.en", [*sentences(20, EN, 7), "", " ".join(EN * 6)]),
            write_lines(tmp / "va.de", [*sentences(20, DE, 7), "leer", " ".join(DE * 6)]),
        ),
    }
    corpus = prepare_text(
        files["train"], tmp / "out", "en", "de", valid=files["valid"], config=SMALL
    )
    return corpus, {"train_in": list(zip(src, tgt, strict=True)), "bad": bad}


def test_prepare_text_counts_every_drop(text_corpus):
    corpus, info = text_corpus
    stats = corpus.stats
    train = stats["splits"]["train"]
    assert train["dropped"] == {"empty": 3, "too_long": 2, "length_ratio": 1}
    assert train["pairs"] == 300 == len(info["train_in"]) - 6
    valid = stats["splits"]["valid"]
    # validation keeps long pairs (scores stay comparable), drops only the empty one
    assert valid["dropped"] == {"empty": 1, "too_long": 0, "length_ratio": 0}
    assert valid["pairs"] == 21
    assert stats["splits"]["test"]["pairs"] == 0


def test_stats_equal_what_was_written(text_corpus):
    corpus, _ = text_corpus
    tokenizer = corpus.tokenizer()
    for split in ("train", "valid", "test"):
        pairs = corpus.read(split)
        numbers = corpus.stats["splits"][split]
        assert numbers["pairs"] == len(pairs)
        for path in corpus.files(split):
            assert len(path.read_text(encoding="utf-8").splitlines()) == len(pairs)
        assert numbers["src_tokens"] == sum(len(tokenizer.encode(s)) for s, _ in pairs)
        assert numbers["tgt_tokens"] == sum(len(tokenizer.encode(t)) for _, t in pairs)


def test_prepared_directory_layout(text_corpus):
    corpus, info = text_corpus
    root = corpus.root
    assert sorted(p.name for p in root.iterdir()) == sorted(
        ["corpus.json", "stats.json", "spm.model", "shortlist.safetensors"]
        + [f"{s}.{lang}" for s in ("train", "valid", "test") for lang in ("en", "de")]
    )
    loaded = PreparedCorpus.load(root)
    assert loaded == corpus
    assert (loaded.src_lang, loaded.tgt_lang) == ("en", "de")
    assert loaded.tokenizer_path == root / "spm.model"
    assert loaded.files("valid") == (root / "valid.en", root / "valid.de")
    kept = [(s, t) for s, t in info["train_in"][:300]]
    assert loaded.read("train") == kept
    with pytest.raises(ValueError, match="split"):
        loaded.files("dev")


def test_special_ids_match_model_config(text_corpus):
    corpus, _ = text_corpus
    tokenizer = corpus.tokenizer()
    defaults = ModelConfig.tiny(vocab_size=tokenizer.vocab_size)
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (
        defaults.pad_id,
        defaults.bos_id,
        defaults.eos_id,
    )
    assert corpus.stats["special_ids"] == {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3}
    assert tokenizer.vocab_size == 60


def test_failed_prepare_leaves_the_old_corpus(text_corpus, tmp_path):
    corpus, _ = text_corpus
    before = {p.name: p.read_bytes() for p in corpus.root.iterdir()}
    train = [shutil.copy(path, tmp_path / f"copy-{path.name}") for path in corpus.files("train")]
    with pytest.raises(ValueError, match="vocab-size"):
        big = PrepareConfig(vocab_size=100_000)
        prepare_text(train, corpus.root, "en", "de", config=big, force=True)
    assert {p.name: p.read_bytes() for p in corpus.root.iterdir()} == before
    with pytest.raises(ValueError, match="is the corpus"):  # reading its own files: never
        prepare_text(corpus.files("train"), corpus.root, "en", "de", force=True)


def test_failed_first_prepare_writes_nothing(tmp_path):
    src = write_lines(tmp_path / "a.en", ["a b c", "d e f"])
    tgt = write_lines(tmp_path / "a.de", ["x y z"])
    with pytest.raises(ValueError, match="differ in length"):
        prepare_text((src, tgt), tmp_path / "out", "en", "de", config=SMALL)
    assert not (tmp_path / "out").exists()
    tgt = write_lines(tmp_path / "a.de", ["x y z", "u v w"])
    with pytest.raises(ValueError, match="vocab-size"):
        prepare_text(
            (src, tgt), tmp_path / "out", "en", "de", config=PrepareConfig(vocab_size=5000)
        )
    assert not (tmp_path / "out").exists()  # nor a temporary beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.de", "a.en"]


def test_load_needs_corpus_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare the corpus first"):
        PreparedCorpus.load(tmp_path)
    (tmp_path / "corpus.json").write_text("{}")
    with pytest.raises(ValueError, match="not a valid corpus description"):
        PreparedCorpus.load(tmp_path)


def test_prepare_tsv(tmp_path):
    pairs = list(zip(sentences(200, EN), sentences(200, DE), strict=True))
    train = tmp_path / "train.tsv"
    train.write_text("".join(f"{s}\t{t}\n" for s, t in pairs) + "\tnur rechts\n", encoding="utf-8")
    test = tmp_path / "test.tsv"
    test.write_text("the cat\tdie Katze\n", encoding="utf-8")
    corpus = prepare_tsv(train, tmp_path / "out", "en", "de", test=test, config=LOOSE)
    assert corpus.read("train") == pairs
    assert corpus.read("test") == [("the cat", "die Katze")]
    assert corpus.stats["splits"]["train"]["dropped"]["empty"] == 1


@pytest.mark.parametrize("layout", ["translation", "columns"])
def test_prepare_hf_from_a_saved_dataset(tmp_path, layout):
    datasets = pytest.importorskip("datasets")
    en, de = sentences(200, EN), sentences(200, DE)

    def build(src, tgt):
        if layout == "translation":  # the wmt14 layout
            rows = [{"de": t, "en": s} for s, t in zip(src, tgt, strict=True)]
            return datasets.Dataset.from_dict({"translation": rows})
        return datasets.Dataset.from_dict({"en": src, "de": tgt})

    saved = tmp_path / "wmt_tiny"
    datasets.DatasetDict(
        {
            "train": build(en, de),
            "validation": build(en[:5], de[:5]),
            "test": build(en[5:8], de[5:8]),
        }
    ).save_to_disk(str(saved))
    corpus = prepare_hf(str(saved), tmp_path / "out", "en", "de", config=LOOSE)
    assert corpus.read("train") == list(zip(en, de, strict=True))
    assert corpus.read("valid") == list(zip(en[:5], de[:5], strict=True))
    assert corpus.read("test") == list(zip(en[5:8], de[5:8], strict=True))
    with pytest.raises(ValueError, match="'fr' and 'de'"):
        prepare_hf(str(saved), tmp_path / "out2", "fr", "de", config=SMALL)


def test_prepare_bible_on_the_fixture(sword_root, tmp_path):
    corpus = prepare_bible(tmp_path / "bible", config=SMALL, root=sword_root)
    stats = corpus.stats
    held_out = stats["source"]["held_out_chapters"]
    # chapters in canonical order: Genesis 1 is the 0th (valid), Genesis 49 the 48th (test)
    assert held_out == {"valid": ["Genesis 1"], "test": ["Genesis 49"]}
    valid_en = [s for s, _ in corpus.read("valid")]
    assert valid_en[0] == "In the beginning, God created the heavens."
    assert all(s.startswith("In 49:") for s, _ in corpus.read("test"))
    train_en = [s for s, _ in corpus.read("train")]
    assert not any(s.startswith(("In 1:", "In 49:")) for s in train_en)
    total = sum(
        stats["splits"][s]["pairs"] + sum(stats["splits"][s]["dropped"].values())
        for s in stats["splits"]
    )
    assert total == stats["source"]["aligned_pairs"] == 149
    assert (corpus.src_lang, corpus.tgt_lang) == ("en", "es")
    again = prepare_bible(tmp_path / "again", config=SMALL, root=sword_root)
    for split in ("train", "valid", "test"):
        assert again.read(split) == corpus.read(split)
