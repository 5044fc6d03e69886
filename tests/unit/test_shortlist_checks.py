"""Shortlists refuse what does not fit (issue 34 item 8): an empty or degenerate shortlist,
at build and at load, and one built for another vocabulary (the sha256 of the tokenizer it
was built with, recorded in the file's metadata and compared at load)."""

from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

import aiayn.apps.serve
from aiayn.apps.translate import Translator
from aiayn.cli import app
from aiayn.data.shortlist import Shortlist, build, vocabulary_digest
from aiayn.data.tokenizer import TOKENIZER_FILE, train_tokenizer
from infer_helpers import VOCAB_SIZE, make_run, sentences

V, EOS = 16, 2
DIGEST_KEY = "vocabulary_sha256"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recorded_digest(path: Path) -> str | None:
    with safe_open(str(path), "pt") as handle:
        return (handle.metadata() or {}).get(DIGEST_KEY)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("shortlist-checks"))


@pytest.fixture(scope="module")
def other_spm(tmp_path_factory) -> Path:
    """A subword model of the same size as the run's, trained on other text."""
    rng = random.Random(7)
    words = ["casa", "jardin", "rio", "arbol", "piedra", "puente", "luz", "agua", "noche"]
    texts = [" ".join(rng.choices(words, k=rng.randint(1, 8))) + "." for _ in range(300)]
    path = tmp_path_factory.mktemp("other") / TOKENIZER_FILE
    tokenizer = train_tokenizer(texts, path, vocab_size=VOCAB_SIZE)
    assert tokenizer.vocab_size == VOCAB_SIZE
    return path


@pytest.fixture
def parallel(tmp_path) -> tuple[Path, Path]:
    source, target = tmp_path / "text.en", tmp_path / "text.de"
    source.write_text("\n".join(sentences(40, seed=1)) + "\n")
    target.write_text("\n".join(sentences(40, seed=2)) + "\n")
    return source, target


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """`aiayn serve` must refuse before it listens: starting the server fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("aiayn serve started a server on a bad shortlist")

    monkeypatch.setattr(aiayn.apps.serve, "run_server", refuse)


def cli(*args) -> object:
    return CliRunner().invoke(app, [str(arg) for arg in args])


def assert_one_error(result, *culprits: str) -> str:
    """Exit 1, no traceback, one error line holding every culprit; returns the line."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if "aiayn: error" in line]
    assert len(errors) == 1, result.output
    for culprit in culprits:
        assert culprit in errors[0], result.output
    return errors[0]


def build_command(run: Path, source: Path, target: Path, out: Path, *extra) -> object:
    args = ["shortlist", "build", run, "--source", source, "--target", target, "--out", out]
    return cli(*args, "--min-count", 1, *extra)


# ----- empty and degenerate shortlists ------------------------------------------------


def test_build_refuses_a_corpus_that_gives_nothing_but_eos():
    with pytest.raises(ValueError, match="no sentence pairs"):
        build([], [], V, EOS)
    with pytest.raises(ValueError, match="would be empty: 2 sentence pairs"):
        build([[], []], [[], []], V, EOS)  # empty lines
    with pytest.raises(ValueError, match="frequent=0, per_source=0"):
        build([[5]], [[10]], V, EOS, frequent=0, per_source=0)
    with pytest.raises(ValueError, match="would be empty"):  # eos is all the target holds
        build([[5], [5]], [[EOS], [EOS]], V, EOS, min_count=1)
    assert build([[5]], [[10]], V, EOS, frequent=1, per_source=0).frequent.tolist() == [10]


def test_cli_build_from_empty_files_is_refused_and_writes_nothing(run, tmp_path):
    source, target = tmp_path / "empty.en", tmp_path / "empty.de"
    source.write_text("")
    target.write_text("")
    out = tmp_path / "s.safetensors"
    assert_one_error(build_command(run, source, target, out), str(source), "no sentence pairs")
    assert not out.exists()
    source.write_text("\n\n")  # two empty lines: pairs, but no pieces
    target.write_text("\n\n")
    assert_one_error(build_command(run, source, target, out), str(target), "would be empty")
    assert not out.exists()


@pytest.mark.parametrize(
    "frequent",
    [[], [EOS]],  # nothing at all; eos alone
    ids=["nothing", "eos-only"],
)
def test_load_refuses_a_degenerate_file(tmp_path, frequent):
    path = Shortlist(torch.tensor(frequent, dtype=torch.long), torch.full((V, 3), -1), EOS).save(
        tmp_path / "degenerate.safetensors"
    )
    with pytest.raises(ValueError, match=r"degenerate\.safetensors: the shortlist is empty"):
        Shortlist.load(path, V)
    table = torch.full((V, 3), -1)
    table[5, 0] = 9  # one translation is enough
    useful = Shortlist(torch.tensor(frequent, dtype=torch.long), table, EOS)
    assert Shortlist.load(useful.save(tmp_path / "one.safetensors"), V).table[5, 0] == 9


@pytest.mark.parametrize("command", ["translate", "evaluate", "serve"])
def test_commands_refuse_an_empty_shortlist(run, tmp_path, parallel, no_server, command):
    empty = Shortlist(torch.zeros(0, dtype=torch.long), torch.full((VOCAB_SIZE, 2), -1), 2)
    path = empty.save(tmp_path / "empty.safetensors")
    source, target = parallel
    out = tmp_path / "out"
    extra = {
        "translate": ["-i", source, "-o", out],
        "evaluate": ["--src", source, "--ref", target, "--out", out],
        "serve": [],
    }[command]
    result = cli(command, run, "--shortlist", path, *extra)
    assert_one_error(result, str(path), "the shortlist is empty")
    assert not out.exists()


def test_translator_refuses_an_empty_shortlist_object(run):
    empty = Shortlist(torch.zeros(0, dtype=torch.long), torch.full((VOCAB_SIZE, 2), -1), 2)
    with pytest.raises(ValueError, match="the shortlist is empty"):
        Translator.load(run, shortlist=empty)


def test_load_refuses_another_eos(run, tmp_path):
    table = torch.full((VOCAB_SIZE, 1), -1)
    other_eos = Shortlist(torch.tensor([5, 6]), table, eos_id=3).save(tmp_path / "eos.safetensors")
    with pytest.raises(ValueError, match=r"eos\.safetensors: shortlist with eos id 3, but"):
        Translator.load(run, shortlist=other_eos)


# ----- the vocabulary it belongs to ---------------------------------------------------


def test_shortlist_build_records_the_tokenizers_sha256(run, tmp_path, parallel):
    out = tmp_path / "s.safetensors"
    result = build_command(run, *parallel, out)
    assert result.exit_code == 0, result.output
    assert recorded_digest(out) == sha256(run / TOKENIZER_FILE)
    assert Shortlist.load(out).vocabulary_sha256 == sha256(run / TOKENIZER_FILE)


def test_prepare_records_the_sha256_of_its_spm_model(tmp_path):
    from aiayn.data.prepare import PrepareConfig, prepare_corpus
    from train_helpers import word_pairs

    rng = random.Random(0)
    splits = {"train": word_pairs(200, rng), "valid": word_pairs(5, rng)}
    corpus = tmp_path / "c"
    prepare_corpus(splits, corpus, "en", "de", PrepareConfig(vocab_size=40))
    assert recorded_digest(corpus / "shortlist.safetensors") == sha256(corpus / TOKENIZER_FILE)


@pytest.mark.parametrize("command", ["translate", "evaluate", "serve"])
def test_commands_refuse_a_shortlist_of_another_vocabulary(
    run, other_spm, tmp_path, parallel, no_server, command
):
    foreign = tmp_path / "foreign.safetensors"
    made = build_command(run, *parallel, foreign, "--tokenizer", other_spm)
    assert made.exit_code == 0, made.output  # the same vocabulary size: only the digest differs
    source, target = parallel
    out = tmp_path / "out"
    extra = {
        "translate": ["-i", source, "-o", out],
        "evaluate": ["--src", source, "--ref", target, "--out", out],
        "serve": [],
    }[command]
    result = cli(command, run, "--shortlist", foreign, *extra)
    assert_one_error(result, str(foreign), sha256(other_spm), sha256(run / TOKENIZER_FILE))
    assert not out.exists()


def test_translator_refuses_a_shortlist_object_of_another_vocabulary(run, other_spm, parallel):
    from aiayn.data.shortlist import build_from_files
    from aiayn.data.tokenizer import SentencePieceTokenizer

    foreign = build_from_files(SentencePieceTokenizer.load(other_spm), *parallel, min_count=1)
    with pytest.raises(ValueError, match=sha256(other_spm)):
        Translator.load(run, shortlist=foreign)
    own = build_from_files(SentencePieceTokenizer.load(run / TOKENIZER_FILE), *parallel)
    assert Translator.load(run, shortlist=own).translate(["house."], beam=1)


def test_a_file_without_a_digest_loads_with_one_warning(run, tmp_path, caplog):
    every = Shortlist(torch.arange(VOCAB_SIZE), torch.full((VOCAB_SIZE, 1), -1), 2)
    old = every.save(tmp_path / "old.safetensors")
    assert recorded_digest(old) is None  # as files written before the digest
    texts = sentences(3)
    with caplog.at_level(logging.WARNING):
        translated = Translator.load(run, shortlist=old).translate(texts, beam=1)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert (
        str(old) in warnings[0].getMessage() and "no vocabulary digest" in warnings[0].getMessage()
    )
    assert translated == Translator.load(run).translate(texts, beam=1)

    caplog.clear()
    every.vocabulary_sha256 = sha256(run / TOKENIZER_FILE)
    new = every.save(tmp_path / "new.safetensors")
    with caplog.at_level(logging.WARNING):
        Translator.load(run, shortlist=new)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_a_marian_vocabulary_digest_covers_its_three_files(tmp_path):
    from test_shortlist import _marian_tokenizer_dir

    from aiayn.io.marian import MarianTokenizer

    _marian_tokenizer_dir(tmp_path)
    names = ("source.spm", "target.spm", "vocab.json")
    expected = hashlib.sha256("".join(sha256(tmp_path / n) for n in names).encode()).hexdigest()
    assert vocabulary_digest(MarianTokenizer(tmp_path)) == expected
    vocab = json.loads((tmp_path / "vocab.json").read_text())
    first, second = list(vocab)[2:4]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # the same pieces, other ids
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    assert vocabulary_digest(MarianTokenizer(tmp_path)) != expected
