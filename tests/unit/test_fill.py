"""MaskFiller and `aiayn fill`.

References: the model's own logits at the masks with a softmax by hand (for an
aiayn run), and transformers' fill-mask pipeline on a random BERT with a WordPiece
vocabulary built here (nothing downloaded).
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from typer.testing import CliRunner

from aiayn import ModelConfig
from aiayn.apps.fill import FillError, MaskFiller
from aiayn.apps.model_use import WrongShapeError
from aiayn.cli import app
from aiayn.data.lm import CLS, MASK, SEP
from aiayn.data.tokenizer import train_tokenizer
from aiayn.io.checkpoint import TOKENIZER_FILE, save_model
from aiayn.models.encoder_only import EncoderOnly
from infer_helpers import sentences

MAX_LEN = 24


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RUN/spm.model (with [CLS], [SEP], [MASK]) and a random BERT's checkpoint."""
    root = tmp_path_factory.mktemp("mlm")
    tokenizer = train_tokenizer(
        sentences(300), root / TOKENIZER_FILE, vocab_size=52, user_defined_symbols=(CLS, SEP, MASK)
    )
    torch.manual_seed(0)
    cfg = ModelConfig.bert(
        vocab_size=tokenizer.vocab_size,
        n_layers=2,
        d_model=32,
        n_heads=4,
        d_ff=64,
        max_len=MAX_LEN,
        dropout=0.0,
    )
    model = EncoderOnly(cfg)
    with torch.no_grad():  # spread-out probabilities, so that the top-k order is clear
        model.encoder.embedding.tokens.weight.normal_(std=0.5)
    run = root / "run"
    save_model(model, run / "checkpoints" / "step-00000001" / "model.safetensors")
    shutil.copy(root / TOKENIZER_FILE, run / TOKENIZER_FILE)
    return run


@pytest.fixture(scope="module")
def filler(mlm_run: Path) -> MaskFiller:
    return MaskFiller.load(mlm_run)


def by_hand(run: Path, filler: MaskFiller, words: list[str], top_k: int):
    """Top-k at each mask of [CLS] words eos [SEP] (as an aiayn MLM run's blocks frame a
    document), the pieces' ids read from the subword model itself."""
    processor = spm.SentencePieceProcessor(model_file=str(run / TOKENIZER_FILE))
    mask = processor.PieceToId(MASK)
    ids = [processor.PieceToId(CLS)]
    for word in words:
        ids += [mask] if word == MASK else processor.EncodeAsIds(word)
    ids += [processor.eos_id(), processor.PieceToId(SEP)]
    with torch.no_grad():
        probs = filler.model(torch.tensor([ids]))[0].softmax(dim=-1)  # (T, V)
    out = []
    for position in [i for i, token in enumerate(ids) if token == mask]:
        values, tokens = probs[position].topk(top_k)
        out.append(list(zip(tokens.tolist(), values.tolist(), strict=True)))
    return out


def test_each_mask_gets_the_top_k_of_its_own_softmax(mlm_run: Path, filler: MaskFiller):
    found = filler.fill_ids("house [MASK] river [MASK] tree", top_k=4)
    expected = by_hand(mlm_run, filler, ["house", MASK, "river", MASK, "tree"], 4)
    assert [[t for t, _ in row] for row in found] == [[t for t, _ in row] for row in expected]
    for row, row_expected in zip(found, expected, strict=True):
        assert [p for _, p in row] == pytest.approx([p for _, p in row_expected], abs=1e-6)
        assert all(a >= b for (_, a), (_, b) in itertools.pairwise(row))
    texts = filler.fill("house [MASK] river [MASK] tree", top_k=4)
    decode = filler.tokenizer.decode
    assert [[text for text, _ in row] for row in texts] == [
        [decode([t]) for t, _ in row] for row in found
    ]


def test_bad_queries_are_refused_by_name(filler: MaskFiller):
    with pytest.raises(FillError, match=r"no \[MASK\]"):
        filler.fill("house garden")
    with pytest.raises(FillError, match=f"max_len={MAX_LEN}"):
        filler.fill("house garden river " * MAX_LEN + MASK)
    with pytest.raises(ValueError, match="top_k"):
        filler.fill("house [MASK]", top_k=0)


def test_a_gpt_run_is_refused_by_the_mask_filler(tmp_path: Path):
    from test_generate import random_lm

    save_model(random_lm(48), tmp_path / "model.safetensors")
    with pytest.raises(WrongShapeError, match=r"decoder_only.*aiayn generate"):
        MaskFiller.load(tmp_path)


def test_aiayn_fill_prints_each_masks_fillers_with_probabilities(mlm_run: Path, filler: MaskFiller):
    result = CliRunner().invoke(app, ["fill", str(mlm_run), "house [MASK] river [MASK]"])
    assert result.exit_code == 0, result.output
    expected = filler.fill("house [MASK] river [MASK]", top_k=5)
    lines = result.stdout.splitlines()
    assert lines[0] == "[MASK] 1:" and lines[6] == "[MASK] 2:" and len(lines) == 12
    for line, (token, probability) in zip(
        lines[1:6] + lines[7:], expected[0] + expected[1], strict=True
    ):
        assert line == f"  {probability:.4f}  {token}"


@pytest.mark.parametrize(
    ("args", "message"),
    [(["house garden"], "no [MASK] to fill"), (["house [MASK]", "--top-k", "0"], "top_k")],
)
def test_aiayn_fill_refuses_bad_input_in_one_line(mlm_run: Path, args, message):
    result = CliRunner().invoke(app, ["fill", str(mlm_run), *args])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert "Traceback" not in result.output


def test_aiayn_fill_refuses_a_gpt_run_in_one_line(tmp_path: Path):
    from test_generate import random_lm

    save_model(random_lm(48), tmp_path / "model.safetensors")
    result = CliRunner().invoke(app, ["fill", str(tmp_path), "house [MASK]"])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "architecture decoder_only" in result.stderr


def test_aiayn_attention_draws_an_encoder_only_run(mlm_run: Path, tmp_path: Path):
    out = tmp_path / "maps"
    result = CliRunner().invoke(app, ["attention", str(mlm_run), "house [MASK]", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out / "encoder.png")
    assert (out / "encoder.png").read_bytes().startswith(b"\x89PNG")


# ----- a BERT directory as transformers saves it ------------------------------------

WORDS = [
    "for",
    "god",
    "so",
    "loved",
    "the",
    "world",
    "that",
    "he",
    "gave",
    "his",
    "only",
    "begotten",
    "son",
    "light",
    "dark",
    "earth",
]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random BertForMaskedLM and a WordPiece vocabulary written here, saved as
    `save_pretrained` does."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    directory = tmp_path_factory.mktemp("bert")
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ed", ",", "."]
    (directory / "vocab.txt").write_text("\n".join(pieces) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(directory / "vocab.txt"))
    tokenizer.save_pretrained(directory)
    config = BertConfig(
        vocab_size=len(pieces),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        initializer_range=0.3,  # spread-out probabilities: no near ties in the top 5
    )
    torch.manual_seed(0)
    BertForMaskedLM(config).eval().save_pretrained(directory)
    return directory


@pytest.mark.parametrize(
    "text", ["for god so [MASK] the world.", "[MASK] god so loved the [MASK], that he gave"]
)
def test_mask_filler_from_hf_equals_the_fill_mask_pipeline(bert_dir: Path, text: str):
    from transformers import AutoTokenizer, BertForMaskedLM, pipeline

    fill_mask = pipeline(
        "fill-mask",
        model=BertForMaskedLM.from_pretrained(bert_dir),
        tokenizer=AutoTokenizer.from_pretrained(bert_dir),
    )
    expected = fill_mask(text, top_k=5)
    if isinstance(expected[0], dict):  # one mask: the pipeline returns a flat list
        expected = [expected]
    found = MaskFiller.from_hf(bert_dir).fill_ids(text, top_k=5)
    assert len(found) == len(expected) == text.count(MASK)
    for row, theirs in zip(found, expected, strict=True):
        assert [token for token, _ in row] == [c["token"] for c in theirs]
        assert [p for _, p in row] == pytest.approx([c["score"] for c in theirs], abs=1e-5)


def test_converted_bert_fills_from_the_command_line(bert_dir: Path, tmp_path: Path):
    out = tmp_path / "converted"
    converted = CliRunner().invoke(app, ["convert", "bert", str(bert_dir), str(out)])
    assert converted.exit_code == 0, converted.output
    expected = MaskFiller.from_hf(bert_dir).fill("for god so [MASK] the world.", top_k=3)
    assert MaskFiller.load(out).fill("for god so [MASK] the world.", top_k=3) == expected
    result = CliRunner().invoke(
        app, ["fill", str(out), "for god so [MASK] the world.", "--top-k", "3"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["[MASK] 1:"] + [
        f"  {probability:.4f}  {token}" for token, probability in expected[0]
    ]
