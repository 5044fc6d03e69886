"""`aiayn induction` on a tiny GPT run: the JSON and PNGs against the library's scores on
the run's own weights, the top heads printed, and bad input refused in one line (exit 1,
no traceback, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from aiayn.analysis.induction import (
    copying_scores,
    induction_scores,
    previous_token_scores,
    repeated_random_tokens,
)
from aiayn.data.tokenizer import SentencePieceTokenizer
from aiayn.io.checkpoint import TOKENIZER_FILE, load_model, resolve_weights
from infer_helpers import shape_runs

PNGS = ("induction.png", "previous-token.png", "copying.png")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return shape_runs(tmp_path_factory.mktemp("induction"))


def invoke(*args):
    from aiayn.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def assert_refused(result, culprit: str, out: Path) -> None:
    """Exit 1, no traceback, one error line naming `culprit`, nothing written."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and culprit in errors[0], result.output
    assert not out.exists()


def test_a_gpt_run_writes_the_three_score_grids_and_prints_the_top_heads(runs, tmp_path):
    out = tmp_path / "out"
    result = invoke(
        "induction", runs["gpt"], "--length", 7, "--batch", 3, "--seed", 5, "--out", out
    )
    assert result.exit_code == 0, result.output
    for png in PNGS:
        assert (out / png).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    data = json.loads((out / "induction.json").read_text())
    assert (data["run"], data["length"], data["batch"], data["seed"]) == (
        str(runs["gpt"]), 7, 3, 5,
    )  # fmt: skip

    model = load_model(resolve_weights(runs["gpt"])).eval()
    tokenizer = SentencePieceTokenizer.load(runs["gpt"] / TOKENIZER_FILE)
    cfg = model.cfg
    specials = (cfg.pad_id, cfg.bos_id, cfg.eos_id, tokenizer.unk_id)
    ids = repeated_random_tokens(cfg.vocab_size, 7, 3, 5, specials, cfg.bos_id)
    expected = {
        "induction": induction_scores(model, ids),
        "previous_token": previous_token_scores(model, ids),
        "copying": copying_scores(model),
    }
    for name, grid in expected.items():
        assert torch.tensor(data[name]).shape == (2, 4)
        torch.testing.assert_close(torch.tensor(data[name]), grid, rtol=1e-6, atol=1e-7)

    lines = result.stdout.splitlines()
    assert lines[0].split() == ["layer", "head", "induction", "previous-token", "copying"]
    rows = [line.split() for line in lines[1:6]]
    printed = [float(row[2]) for row in rows]
    best = expected["induction"].flatten().sort(descending=True).values[:5]
    assert printed == pytest.approx(best.tolist(), abs=5e-4)
    layer, head = int(rows[0][0]), int(rows[0][1])
    assert expected["induction"][layer, head] == expected["induction"].max()
    assert float(rows[0][4]) == pytest.approx(expected["copying"][layer, head].item(), abs=5e-4)


@pytest.mark.parametrize("run", ["mt", "bert"])
def test_a_translation_or_bert_run_is_refused_by_its_shape(runs, tmp_path, run):
    out = tmp_path / "out"
    shape = {"mt": "encoder_decoder", "bert": "encoder_only"}[run]
    assert_refused(invoke("induction", runs[run], "--out", out), f"a {shape} model", out)


@pytest.mark.parametrize(
    "args, culprit",
    [
        (["--length", 12], "--length 12"),  # 1 + 2 x 12 = 25 > max_len 24
        (["--length", 0], "--length"),
        (["--batch", 0], "--batch"),
    ],
)
def test_bad_sizes_are_refused_in_one_line(runs, tmp_path, args, culprit):
    out = tmp_path / "out"
    assert_refused(invoke("induction", runs["gpt"], *args, "--out", out), culprit, out)
