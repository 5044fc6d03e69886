"""`aiayn align` on a tiny trained translation run, a run without a corpus, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from aiayn import ModelConfig
from aiayn.data.corpus import PreparedCorpus
from aiayn.data.tokenizer import train_tokenizer
from aiayn.io.checkpoint import TOKENIZER_FILE
from aiayn.models.decoder_only import DecoderOnly
from aiayn.training.trainer import train_from_recipe
from infer_helpers import make_run, save_run, sentences
from train_helpers import RECIPE, make_corpus


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("align")
    corpus = make_corpus(root / "en-de", train_pairs=60)
    overrides = [
        f"data.corpus={corpus}",
        "train.max_steps=2",
        "train.valid_every_steps=null",
        "train.valid_bleu_sentences=0",
    ]
    train_from_recipe(RECIPE, root / "mt", overrides, progress=False)
    spm = root / "lm" / TOKENIZER_FILE
    tokenizer = train_tokenizer(sentences(300), spm, vocab_size=52)
    torch.manual_seed(0)
    gpt = DecoderOnly(
        ModelConfig.gpt(
            vocab_size=tokenizer.vocab_size, n_layers=1, d_model=16, n_heads=2, d_ff=32, max_len=24
        )
    )
    (root / "src").write_text("the house\nthe garden by the river\n", encoding="utf-8")
    (root / "ref").write_text("das haus\nein haus\n", encoding="utf-8")
    return {
        "root": root,
        "corpus": corpus,
        "mt": root / "mt",
        "bare": make_run(root / "bare"),
        "gpt": save_run(root / "gpt", gpt, spm),
    }


def invoke(*args: object):
    from aiayn.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def assert_one_line(result, culprit: str) -> None:
    """Exit 1, no traceback, one error line naming `culprit`."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and culprit in errors[0], result.output


def links(text: str) -> set[tuple[int, int]]:
    return {tuple(int(i) for i in link.split("-")) for link in text.split()}


def test_a_translation_run_aligns_its_test_split(runs, tmp_path):
    out = tmp_path / "align"
    result = invoke("align", runs["mt"], "--pairs", 3, "--out", out)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "align.json").read_text(encoding="utf-8"))
    test_pairs = PreparedCorpus.load(runs["corpus"]).read("test")[:3]
    assert data["pairs"] == 3 and data["model1_pairs"] == 60 + 3
    assert data["src"].endswith("test.en")
    layers = [key for key in data["aer"] if key.startswith("layer")]
    assert layers == ["layer 0"] and "rollout" in data["aer"]  # tiny-test: one decoder layer
    for sentence, (source, target) in zip(data["sentences"], test_pairs, strict=True):
        # the words are the text's words (the corpus has no punctuation to split off)
        assert (sentence["source"], sentence["target"]) == (source.split(), target.split())
        # attention links every target word to one source word
        for name in ("layer 0", "rollout"):
            found = links(sentence[name])
            assert sorted(j for _, j in found) == list(range(len(target.split())))
    # AER recomputed from the written links: 1 - 2 |A ∩ R| / (|A| + |R|), summed
    for name in ("layer 0", "rollout"):
        common = total = 0
        for sentence in data["sentences"]:
            a, r = links(sentence[name]), links(sentence["model1"])
            common, total = common + len(a & r), total + len(a) + len(r)
        assert data["aer"][name] == pytest.approx(1 - 2 * common / total)
    # the baseline that reads no model: the same relative position, centre of each share
    common = total = 0
    for sentence in data["sentences"]:
        n_src, n_tgt = len(sentence["source"]), len(sentence["target"])
        a = {(int((j + 0.5) * n_src / n_tgt), j) for j in range(n_tgt)}
        r = links(sentence["model1"])
        common, total = common + len(a & r), total + len(a) + len(r)
    assert data["aer"]["diagonal"] == pytest.approx(1 - 2 * common / total)
    printed = result.stdout.splitlines()
    assert printed[1].split()[:2] == ["layer", "0"] and printed[2].startswith("rollout")
    assert printed[3].startswith("diagonal")
    assert float(printed[2].split()[1]) == pytest.approx(data["aer"]["rollout"], abs=1e-4)


def test_a_run_without_a_corpus_aligns_the_given_files(runs, tmp_path):
    out = tmp_path / "align"
    root = runs["root"]
    result = invoke(
        "align", runs["bare"], "--src", root / "src", "--ref", root / "ref", "--out", out
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "align.json").read_text(encoding="utf-8"))
    assert data["pairs"] == 2 and data["model1_pairs"] == 2
    assert data["sentences"][1]["source"] == ["the", "garden", "by", "the", "river"]


def test_a_gpt_run_is_refused_in_one_line(runs, tmp_path):
    out = tmp_path / "align"
    result = invoke(
        "align",
        runs["gpt"],
        "--src",
        runs["root"] / "src",
        "--ref",
        runs["root"] / "ref",
        "--out",
        out,
    )
    assert_one_line(result, "decoder_only")
    assert not out.exists()


@pytest.mark.parametrize(
    ("run", "args", "culprit"),
    [
        ("mt", ["--pairs", "0"], "--pairs must be at least 1"),
        ("mt", ["--split", "dev"], "split must be one of"),
        ("mt", ["--src", "x"], "both --src FILE and --ref FILE"),
        ("bare", [], "config.yaml"),
    ],
)
def test_bad_input_fails_in_one_line(runs, tmp_path, run, args, culprit):
    result = invoke("align", runs[run], "--out", tmp_path / "align", *args)
    assert_one_line(result, culprit)
    assert not (tmp_path / "align").exists()
