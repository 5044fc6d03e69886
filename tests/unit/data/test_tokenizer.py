"""The shared subword model: round trip, special ids, bounded training sample."""

from __future__ import annotations

import re
import unicodedata

import pytest

from aiayn.config import ModelConfig
from aiayn.data.tokenizer import SentencePieceTokenizer, Tokenizer, train_tokenizer

ENGLISH = [
    "In the beginning, God created the heavens and the earth.",
    "The earth was formless and empty.",
    "God said, “Let there be light,” and there was light.",
    "Don’t be afraid; I am with you — always.",
]
SPANISH = [
    "EN el principio crió Dios los cielos y la tierra.",
    "Y la tierra estaba desordenada y vacía.",
    "¿Quién es el que te dijo: Toma tu lecho y anda?",
    "¡Oh Jehová, cuánto se han multiplicado mis enemigos!",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> SentencePieceTokenizer:
    texts = [f"{s} {i}" for i in range(40) for s in ENGLISH + SPANISH]
    return train_tokenizer(texts, tmp_path_factory.mktemp("spm") / "spm.model", vocab_size=300)


def reference_normalise(text: str) -> str:
    """sentencepiece's default rule (nmt_nfkc), written out: NFKC, one space, stripped."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text)).strip()


@pytest.mark.parametrize(
    "text",
    [
        *ENGLISH,
        *SPANISH,
        "  leading and   inner   spaces ",
        "Numbers 3:16, fractions ½ and a ﬁ ligature…",
        "unseen words: zebra Ω",
    ],
)
def test_round_trip_is_lossless_after_normalisation(tokenizer, text):
    ids = tokenizer.encode(text)
    assert all(isinstance(i, int) for i in ids)
    decoded = tokenizer.decode(ids)
    if tokenizer.unk_id not in ids:
        assert decoded == reference_normalise(text)


def test_known_characters_never_become_unk(tokenizer):
    for text in ENGLISH + SPANISH:
        assert tokenizer.unk_id not in tokenizer.encode(text)


def test_special_ids_match_model_config(tokenizer):
    config = ModelConfig.tiny(vocab_size=tokenizer.vocab_size)
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (
        config.pad_id,
        config.bos_id,
        config.eos_id,
    )
    assert tokenizer.unk_id == 3
    assert tokenizer.vocab_size == 300
    # encode adds no specials; decode drops them
    ids = tokenizer.encode(ENGLISH[0])
    assert not {tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id} & set(ids)
    padded = [tokenizer.bos_id, *ids, tokenizer.eos_id, tokenizer.pad_id, tokenizer.pad_id]
    assert tokenizer.decode(padded) == tokenizer.decode(ids)


def test_encode_batch_equals_encode(tokenizer):
    texts = ENGLISH + SPANISH
    assert tokenizer.encode_batch(texts) == [tokenizer.encode(t) for t in texts]


def test_load_round_trip(tokenizer, tmp_path):
    loaded = SentencePieceTokenizer.load(tokenizer.path)
    assert loaded.encode(SPANISH[2]) == tokenizer.encode(SPANISH[2])
    with pytest.raises(FileNotFoundError):
        SentencePieceTokenizer.load(tmp_path / "missing.model")
    (tmp_path / "bad.model").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        SentencePieceTokenizer.load(tmp_path / "bad.model")


def test_training_sample_is_bounded_and_seeded(tmp_path, caplog):
    texts = [f"{s} {i}" for i in range(200) for s in ENGLISH + SPANISH]
    caplog.set_level("INFO", logger="aiayn.data.tokenizer")
    a = train_tokenizer(texts, tmp_path / "a.model", vocab_size=120, sample_size=100, seed=1)
    b = train_tokenizer(texts, tmp_path / "b.model", vocab_size=120, sample_size=100, seed=1)
    assert (tmp_path / "a.model").read_bytes() == (tmp_path / "b.model").read_bytes()
    assert a.vocab_size == b.vocab_size == 120
    assert "on 100 sentences" in caplog.text
    small = train_tokenizer(texts[:60], tmp_path / "c.model", vocab_size=100)  # < 100 is fine
    assert small.vocab_size == 100


def test_it_is_a_tokenizer_and_names_its_pieces(tokenizer):
    assert isinstance(tokenizer, Tokenizer)
    assert [tokenizer.id_to_piece(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
    text = SPANISH[0]
    assert [tokenizer.id_to_piece(i) for i in tokenizer.encode(text)] == tokenizer.pieces(text)
    with pytest.raises(ValueError, match="300 pieces"):
        tokenizer.id_to_piece(300)
