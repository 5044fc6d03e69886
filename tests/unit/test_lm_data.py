"""Monolingual data (aiayn.data.lm): corpora, packing by hand, padding share, batches."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from aiayn.cli import app
from aiayn.data.corpus import PreparedCorpus
from aiayn.data.lm import (
    SYMBOLS,
    SequenceBatches,
    TokenBatch,
    pack,
    padded,
    prepare_lm_bible,
    prepare_lm_text,
    read_documents,
    symbol_ids,
)
from aiayn.data.prepare import PrepareConfig, prepare_bible
from train_helpers import EN

SMALL = PrepareConfig(vocab_size=60)
WORDS = EN  # ten English words


def _sword_fixture():
    path = Path(__file__).parent / "data" / "sword_fixture.py"
    spec = importlib.util.spec_from_file_location("lm_sword_fixture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sword_root(tmp_path_factory) -> Path:
    """Tiny WEB and RV1909 modules: Genesis, 50 chapters of 3 verses."""
    fixture = _sword_fixture()
    root = tmp_path_factory.mktemp("sword")
    verses = fixture.chapter_verses(50, 3)
    fixture.write_ztext_module(root, "engWEB2015eb", "en", {r: en for r, (en, _) in verses.items()})
    fixture.write_ztext_module(root, "spaRV1909eb", "es", {r: es for r, (_, es) in verses.items()})
    return root


def write_text(path: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    lines = [" ".join(rng.choice(WORDS, size=rng.integers(3, 12))) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ----- corpora ---------------------------------------------------------------------


def test_prepare_lm_text_writes_a_monolingual_corpus_with_the_bert_symbols(tmp_path):
    train = write_text(tmp_path / "train.txt", 200, 0)
    (tmp_path / "valid.txt").write_text("the river\n\n  \nthe stone bridge\n", encoding="utf-8")
    corpus = prepare_lm_text(train, tmp_path / "lm", "en", valid=tmp_path / "valid.txt",
                             config=SMALL)  # fmt: skip
    assert (corpus.src_lang, corpus.tgt_lang) == ("en", "en")
    assert read_documents(corpus, "valid") == ["the river", "the stone bridge"]
    assert read_documents(corpus, "train") == train.read_text().splitlines()
    stats = corpus.stats
    assert stats["splits"]["valid"]["dropped_empty"] == 2
    assert stats["splits"]["valid"]["documents"] == 2
    tokenizer = corpus.tokenizer()
    ids = symbol_ids(tokenizer)
    assert sorted(ids) == sorted(SYMBOLS) and sorted(ids.values()) == [4, 5, 6]  # after unk
    assert {tokenizer.id_to_piece(i) for i in ids.values()} == set(SYMBOLS)
    assert set(SYMBOLS) <= set(tokenizer.pieces("[CLS] the [MASK] river [SEP]"))


def test_read_documents_refuses_a_parallel_corpus(sword_root, tmp_path):
    parallel = prepare_bible(tmp_path / "bible", config=SMALL, root=sword_root)
    with pytest.raises(ValueError, match=r"parallel corpus .*aiayn prepare lm"):
        read_documents(parallel, "train")


def test_lm_bible_splits_are_the_parallel_corpus_splits(sword_root, tmp_path):
    """Nothing of the translation test set leaks into a language model's training text."""
    parallel = prepare_bible(tmp_path / "bible", config=SMALL, root=sword_root)
    for lang, side in (("en", 0), ("es", 1)):
        mono = prepare_lm_bible(tmp_path / lang, lang, config=SMALL, root=sword_root)
        for split in ("valid", "test"):
            assert read_documents(mono, split) == [p[side] for p in parallel.read(split)]
        test = set(read_documents(mono, "test"))
        assert test and not test & set(read_documents(mono, "train"))


def test_prepare_lm_cli_text_and_a_bad_language(tmp_path):
    runner = CliRunner()
    train = write_text(tmp_path / "train.txt", 200, 0)
    args = ["prepare", "lm", "text", str(train), str(tmp_path / "lm"), "--lang", "en"]
    result = runner.invoke(app, [*args, "--vocab-size", "60"])
    assert result.exit_code == 0, result.output
    assert "train:       200 documents" in result.output
    assert PreparedCorpus.load(tmp_path / "lm").src_lang == "en"
    result = runner.invoke(app, ["prepare", "lm", "bible", "--lang", "fr", str(tmp_path / "fr")])
    assert result.exit_code == 1 and "--lang must be en or es, got 'fr'" in result.output
    assert not (tmp_path / "fr" / "corpus.json").exists()


def test_prepare_lm_cli_char_model_has_one_piece_per_character(tmp_path):
    runner = CliRunner()
    train = write_text(tmp_path / "train.txt", 200, 0)
    args = ["prepare", "lm", "text", str(train), str(tmp_path / "chars"), "--lang", "en"]
    result = runner.invoke(app, [*args, "--model-type", "char", "--vocab-size", "500"])
    assert result.exit_code == 0, result.output
    tokenizer = PreparedCorpus.load(tmp_path / "chars").tokenizer()
    letters = set(train.read_text(encoding="utf-8").replace("\n", "").replace(" ", ""))
    # specials (4) + the BERT symbols (3) + the word-start piece + each letter, not 500
    assert tokenizer.vocab_size == 4 + len(SYMBOLS) + 1 + len(letters)
    assert tokenizer.pieces("the river") == ["\u2581", *"the", "\u2581", *"river"]
    args = ["prepare", "lm", "text", str(train), str(tmp_path / "w"), "--model-type", "word"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert "model_type must be one of bpe, unigram, char, got 'word'" in result.output


def test_prepare_lm_text_names_the_file_and_line_of_bad_utf8(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the river\nthe \xff stone\n")
    result = CliRunner().invoke(app, ["prepare", "lm", "text", str(bad), str(tmp_path / "out")])
    assert result.exit_code == 1
    assert f"{bad}:2: invalid UTF-8" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out" / "corpus.json").exists()


# ----- packing -----------------------------------------------------------------------


def test_pack_by_hand():
    documents = [[5, 6], [7], [8, 9, 10]]  # stream: 5 6 2 7 2 8 9 10 2 (eos 2)
    packed = pack(documents, 2, 3)
    assert packed.blocks == [[5, 6, 2], [7, 2, 8], [9, 10, 2]]
    assert (packed.stream_tokens, packed.left_out) == (9, 0)
    # a language model's blocks share one id: each id but the first is a target once
    packed = pack(documents, 2, 4, overlap=1)
    assert packed.blocks == [[5, 6, 2, 7], [7, 2, 8, 9]]
    assert packed.left_out == 2  # 10 and the last eos fill no block
    assert pack([[5]], 2, 3).blocks == []
    with pytest.raises(ValueError, match="overlap < length"):
        pack(documents, 2, 3, overlap=3)


def lm_make(rows, rng: np.random.Generator) -> TokenBatch:
    """A batch whose labels hold draws of `rng`, to see them reproduced."""
    inputs = padded([r[:-1] for r in rows], 0)
    labels = torch.from_numpy(rng.integers(1, 1000, size=inputs.shape))
    return TokenBatch(inputs, labels, int((inputs != 0).sum()))


def test_packed_blocks_hold_no_padding():
    rng = np.random.default_rng(0)
    documents = [rng.integers(3, 50, size=rng.integers(1, 30)).tolist() for _ in range(100)]
    blocks = pack(documents, 2, 17, overlap=1).blocks
    batches = SequenceBatches(blocks, lm_make, 64, pad_id=0)
    assert batches.padding_fraction() == 0.0
    for batch in batches.epoch(0):
        assert batch.inputs.shape[1] == 16 and not (batch.inputs == 0).any()


def test_padding_fraction_counts_the_padded_inputs():
    rng = np.random.default_rng(1)
    sequences = [rng.integers(3, 50, size=rng.integers(2, 20)).tolist() for _ in range(60)]
    batches = SequenceBatches(sequences, lm_make, 80, pad_id=0, shuffle=False)
    pad = total = 0
    for batch in batches.epoch(0):
        pad += int((batch.inputs == 0).sum())
        total += batch.inputs.numel()
    assert 0 < batches.padding_fraction() == pytest.approx(pad / total)


def test_sequence_batches_resume_draws_what_an_uninterrupted_epoch_draws():
    sequences = pack([list(range(3, 40))] * 20, 2, 9).blocks
    batches = SequenceBatches(sequences, lm_make, 40, pad_id=0, seed=7)
    whole = list(batches.epoch(3))
    resumed = list(batches.epoch(3, skip=4))
    assert len(resumed) == len(whole) - 4
    for a, b in zip(whole[4:], resumed, strict=True):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    other_epoch = list(batches.epoch(4))
    assert not all(torch.equal(a.labels, b.labels) for a, b in zip(whole, other_epoch, strict=True))


def test_sequence_batches_shard_by_rank():
    sequences = [[3 + i] * 9 for i in range(31)]  # 31 distinct blocks
    ranks = [
        SequenceBatches(sequences, lm_make, 40, 0, seed=1, rank=r, world_size=2) for r in (0, 1)
    ]
    assert len(ranks[0]) == len(ranks[1])
    seen = [tuple(row) for r in ranks for b in r.epoch(0) for row in b.inputs.tolist()]
    assert {row[0] for row in seen} == {s[0] for s in sequences}  # every block, on one rank
    assert len(seen) - len(sequences) < 40 // 9  # but the fill's repeated batch
