"""A CUDA smoke run of the command line: train -> average -> translate -> evaluate on the
tiny recipe, every step with --device cuda, and the GPU's translations equal to the CPU's
from the same weights. Skips without a CUDA device (see test_cuda.py)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from aiayn.cli import app
from train_helpers import RECIPE, make_corpus

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: no CUDA device here"
)


def run(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_train_average_translate_evaluate_on_the_gpu(tmp_path, precision):
    corpus = make_corpus(tmp_path / "corpus")
    train_run = tmp_path / "run"
    run(
        "train", str(RECIPE), f"data.corpus={corpus}", f"train.precision={precision}",
        "--run", str(train_run), "--device", "cuda", "--no-progress",
    )  # fmt: skip
    log = (train_run / "train.log").read_text(encoding="utf-8")
    assert "on cuda" in log.splitlines()[0]  # "training N parameters at translation on cuda"
    steps = [json.loads(line) for line in (train_run / "metrics.jsonl").open(encoding="utf-8")]
    losses = [row["loss"] for row in steps if row.get("kind") == "train"]
    assert losses and all(loss == loss for loss in losses)  # finite, no nan
    assert "average-last-2" in run("average", str(train_run), "--last", "2")

    source = corpus / "test.en"
    outputs = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / f"hyp-{device}.txt"
        run(
            "translate", str(train_run), "--input", str(source), "--output", str(out),
            "--device", device, "--beam", "4",
        )  # fmt: skip
        outputs[device] = out.read_text(encoding="utf-8").splitlines()
    assert len(outputs["cuda"]) == len(source.read_text(encoding="utf-8").splitlines())
    assert outputs["cuda"] == outputs["cpu"]

    scores_dir = tmp_path / "eval"
    run("evaluate", str(train_run), "--split", "test", "--device", "cuda", "--out", str(scores_dir))
    scores = json.loads((scores_dir / "scores.json").read_text(encoding="utf-8"))
    assert 0.0 <= scores["bleu"] <= 100.0
