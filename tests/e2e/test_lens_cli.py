"""`aiayn lens` on a tiny translation run and a tiny GPT run, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from aiayn import ModelConfig
from aiayn.analysis.logit_lens import logit_lens
from aiayn.apps.translate import Translator
from aiayn.data.tokenizer import train_tokenizer
from aiayn.io.checkpoint import TOKENIZER_FILE
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_only import EncoderOnly
from infer_helpers import make_run, save_run, sentences

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lens")
    spm = root / "lm" / TOKENIZER_FILE
    tokenizer = train_tokenizer(sentences(300), spm, vocab_size=52)
    shape = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "max_len": 24}
    torch.manual_seed(0)
    gpt = DecoderOnly(ModelConfig.gpt(vocab_size=tokenizer.vocab_size, dropout=0.0, **shape))
    bert = EncoderOnly(ModelConfig.bert(vocab_size=tokenizer.vocab_size, dropout=0.0, **shape))
    return {
        "mt": make_run(root / "mt"),
        "gpt": save_run(root / "gpt", gpt, spm),
        "bert": save_run(root / "bert", bert, spm),
    }


def invoke(*args: str):
    from aiayn.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def assert_one_line(result, culprit: str) -> None:
    """Exit 1, no traceback, one error line naming `culprit`."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and culprit in errors[0], result.output


def read_written(out: Path) -> dict:
    assert (out / "lens.png").read_bytes().startswith(PNG_MAGIC)
    return json.loads((out / "lens.json").read_text(encoding="utf-8"))


def test_gpt_run_writes_the_lens_of_the_prompt(runs, tmp_path):
    out = tmp_path / "lens"
    result = invoke("lens", runs["gpt"], "the house by the river", "--out", out, "--top-k", 3)
    assert result.exit_code == 0, result.output
    data = read_written(out)
    assert data["run"] == str(runs["gpt"]) and data["text"] == "the house by the river"
    assert [layer["layer"] for layer in data["layers"]] == ["embed", "layer 0", "layer 1"]
    n_positions = len(data["positions"])
    assert all(len(layer["positions"]) == n_positions for layer in data["layers"])
    assert all(len(cell["top"]) == 3 for cell in data["layers"][0]["positions"])
    last = data["layers"][-1]["positions"]
    assert all(cell["predicted_rank"] == 0 for cell in last)  # the model's own output
    # the printed table: a header of input pieces, then the last layer's top-1 pieces
    lines = result.stdout.splitlines()
    assert lines[1].split()[:2] == ["layer", "1"]
    assert lines[1].split()[2:] == [cell["top"][0]["piece"][:10] for cell in last]


def test_gpt_run_with_a_continuation_follows_each_next_token(runs, tmp_path):
    from aiayn.apps.generate import Generator

    generator = Generator.load(runs["gpt"])
    text = [*generator.tokenizer.encode("the house"), *generator.tokenizer.encode("by the river")]
    out = tmp_path / "lens"
    result = invoke("lens", runs["gpt"], "the house", "--target", "by the river", "--out", out)
    assert result.exit_code == 0, result.output
    data = read_written(out)
    assert [p["input_id"] for p in data["positions"]] == text[:-1]
    assert [p["target_id"] for p in data["positions"]] == text[1:]
    with torch.no_grad():  # the last layer is the model's own next-token distribution
        probs = generator.model(torch.tensor([text[:-1]])).softmax(-1)[0]  # (T, V)
    expected = probs.gather(-1, torch.tensor(text[1:]).unsqueeze(-1)).squeeze(-1)
    got = [cell["target_prob"] for cell in data["layers"][-1]["positions"]]
    assert got == pytest.approx(expected.tolist(), rel=1e-5, abs=1e-7)


def test_translation_run_follows_its_greedy_translation_or_the_given_target(runs, tmp_path):
    translator = Translator.load(runs["mt"])
    (greedy,) = translator.translate(["the house"], beam=1)
    out = tmp_path / "greedy"
    result = invoke("lens", runs["mt"], "the house", "--out", out)
    assert result.exit_code == 0, result.output
    data = read_written(out)
    positions = data["positions"]
    cfg = translator.model.cfg
    assert positions[0]["input_id"] == cfg.bos_id and positions[-1]["target_id"] == cfg.eos_id
    assert translator.tokenizer.decode([p["input_id"] for p in positions[1:]]) == greedy
    assert [p["target_id"] for p in positions[:-1]] == [p["input_id"] for p in positions[1:]]
    # greedy: the target is the model's own choice wherever that is not pad or bos (which
    # the search never picks), and the last layer ranks the predicted token first
    for p in positions[:-1]:
        assert p["predicted_id"] in (cfg.pad_id, cfg.bos_id, p["target_id"])

    out = tmp_path / "given"
    result = invoke("lens", runs["mt"], "the house", "--target", "das haus", "--out", out)
    assert result.exit_code == 0, result.output
    data = read_written(out)
    ids = translator.tokenizer.encode("das haus")
    assert [p["input"] for p in data["positions"]] == [
        translator.tokenizer.id_to_piece(i) for i in [cfg.bos_id, *ids]
    ]
    src = translator.to_batch(translator.encode(["the house"]))
    expected = logit_lens(translator.model, (src, torch.tensor([[cfg.bos_id, *ids]])), top_k=5)
    got = [cell["top"][0]["id"] for cell in data["layers"][1]["positions"]]
    assert got == expected.top_ids[1, 0, :, 0].tolist()


@pytest.mark.parametrize(
    ("args", "culprit"),
    [
        (("{root}/nope", "the house"), "nope"),
        (("{bert}", "the house"), "encoder_only"),
        (("{gpt}", "the house", "--target", "  "), "--target"),
        (("{gpt}", "the house", "--target", " ".join(["house"] * 30)), "--target"),
        (("{mt}", "the house", "--top-k", "0"), "--top-k"),
        (("{mt}", "the house", "--top-k", "100000"), "--top-k"),
        (("{mt}", "   "), "empty"),
        (("{gpt}", "   "), "empty"),
        (("{gpt}", " ".join(["house"] * 30)), "max_len"),
        (("{mt}", "the house", "--target", " ".join(["haus"] * 40)), "--target"),
        (("{gpt}", "the house", "--tokenizer", "{mt}/spm.model"), "--tokenizer"),
        (("{mt}", "the house", "--device", "tpu"), "--device"),
    ],
    ids=[
        "missing-run",
        "bert",
        "gpt-target-empty",
        "gpt-target-too-long",
        "top-k-0",
        "top-k-huge",
        "mt-empty",
        "gpt-empty",
        "gpt-too-long",
        "mt-target-too-long",
        "gpt-tokenizer",
        "device",
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(runs, tmp_path, args, culprit):
    names = {key: str(value) for key, value in runs.items()} | {"root": str(tmp_path)}
    out = tmp_path / "out"
    result = invoke("lens", *(a.format(**names) for a in args), "--out", out)
    assert_one_line(result, culprit)
    assert not out.exists()


def test_an_out_that_is_a_file_is_refused_and_kept(runs, tmp_path):
    out = tmp_path / "existing.txt"
    out.write_text("keep\n")
    result = invoke("lens", runs["gpt"], "the house", "--out", out)
    assert_one_line(result, "existing.txt")
    assert out.read_text() == "keep\n"
