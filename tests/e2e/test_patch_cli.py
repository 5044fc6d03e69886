"""`aiayn patch` on a tiny GPT run and a tiny translation run: the PNG and the JSON, the
metrics against a hand computation on the run's own weights, and bad input refused in
one line (exit 1, no traceback, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from aiayn.cli import app
from aiayn.data.tokenizer import SentencePieceTokenizer
from aiayn.io.checkpoint import TOKENIZER_FILE, load_model, resolve_weights
from infer_helpers import shape_runs

CLEAN, CORRUPT = "das haus.", "ein haus."  # 5 pieces each: ▁das|▁ein ▁h a us .


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return shape_runs(tmp_path_factory.mktemp("patch"))


def _model(run: Path):
    model = load_model(resolve_weights(run)).eval()
    return model, SentencePieceTokenizer.load(run / TOKENIZER_FILE)


def _written(out: Path) -> dict:
    assert (out / "patching.png").read_bytes().startswith(b"\x89PNG")
    return json.loads((out / "patching.json").read_text())


def test_a_gpt_run_patches_its_prompt(runs, tmp_path):
    out = tmp_path / "out"
    args = ["patch", str(runs["gpt"]), "--clean", CLEAN, "--corrupt", CORRUPT]
    result = CliRunner().invoke(
        app, [*args, "--right", "garden", "--wrong", "das", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    record = _written(out)

    model, tokenizer = _model(runs["gpt"])
    right, wrong = tokenizer.encode("garden")[0], tokenizer.encode("das")[0]
    with torch.no_grad():
        clean = model(torch.tensor([tokenizer.encode(CLEAN)]))[0, -1]
        corrupt = model(torch.tensor([tokenizer.encode(CORRUPT)]))[0, -1]
    assert record["clean_metric"] == pytest.approx(float(clean[right] - clean[wrong]), abs=1e-5)
    assert record["corrupt_metric"] == pytest.approx(
        float(corrupt[right] - corrupt[wrong]), abs=1e-5
    )
    assert record["positions"] == ["▁das/▁ein", "▁h", "a", "us", "."]
    assert record["layers"] == ["layer 0", "layer 1"]
    assert record["stack"] == "decoder" and record["effect_is"] == "patched - corrupt"
    effect = torch.tensor(record["effect"])
    assert effect.shape == (2, 5)
    # the first token is the only difference: patching it where it enters is the clean run,
    # and the positions whose token is the same change nothing there
    assert effect[0, 0].item() == pytest.approx(
        record["clean_metric"] - record["corrupt_metric"], abs=1e-5
    )
    assert effect[0, 1:].abs().max().item() < 1e-6


@pytest.mark.parametrize("target", ["garden", "garden."])  # one token, then several
def test_a_gpt_run_scores_the_target_after_the_prompt(runs, tmp_path, target):
    out = tmp_path / "out"
    args = [
        "patch",
        str(runs["gpt"]),
        "--clean",
        CLEAN,
        "--corrupt",
        CORRUPT,
        "--metric",
        "logprob",
    ]
    result = CliRunner().invoke(app, [*args, "--target", target, "--out", str(out)])
    assert result.exit_code == 0, result.output
    record = _written(out)

    model, tokenizer = _model(runs["gpt"])
    target_ids = tokenizer.encode(target)

    def logprob(prompt: str) -> float:
        """log P(target | prompt) = sum over i of log P(target_i | prompt + target[:i])."""
        ids = tokenizer.encode(prompt)
        total = 0.0
        for token in target_ids:
            with torch.no_grad():
                logits = model(torch.tensor([ids]))[0, -1]
            total += float(torch.log_softmax(logits, -1)[token])
            ids = [*ids, token]
        return total

    assert record["clean_metric"] == pytest.approx(logprob(CLEAN), abs=1e-4)
    assert record["corrupt_metric"] == pytest.approx(logprob(CORRUPT), abs=1e-4)


def test_a_translation_run_patches_its_source_and_scores_the_reference(runs, tmp_path):
    out = tmp_path / "out"
    args = ["patch", str(runs["mt"]), "--clean", CLEAN, "--corrupt", CORRUPT, "--metric", "logprob"]
    result = CliRunner().invoke(
        app, [*args, "--target", "garden.", "--out", str(out), "--normalize"]
    )
    assert result.exit_code == 0, result.output
    record = _written(out)

    model, tokenizer = _model(runs["mt"])
    target = tokenizer.encode("garden.")
    eos, bos = model.cfg.eos_id, model.cfg.bos_id
    tgt_in = torch.tensor([[bos, *target]])

    def logprob(text: str) -> float:
        with torch.no_grad():
            logits = model(torch.tensor([[*tokenizer.encode(text), eos]]), tgt_in)
        scored = torch.log_softmax(logits[0], -1)
        return float(sum(scored[i, t] for i, t in enumerate([*target, eos])))

    assert record["clean_metric"] == pytest.approx(logprob(CLEAN), abs=1e-4)
    assert record["corrupt_metric"] == pytest.approx(logprob(CORRUPT), abs=1e-4)
    assert record["stack"] == "encoder" and record["metric"] == {"name": "logprob"}
    assert record["positions"] == ["▁das/▁ein", "▁h", "a", "us", ".", "</s>"]
    effect = torch.tensor(record["effect"])
    assert effect.shape == (model.cfg.n_encoder_layers, 6)
    assert effect[0, 0].item() == pytest.approx(1.0, abs=1e-4)  # normalised: all of it
    assert effect[0, 1:].abs().max().item() < 1e-4


def _w_o_input_patched(model, w_o, columns, clean, corrupt, tgt_in):
    """The corrupted run's logits with `columns` of W^O's input from the clean run."""
    kept = {}
    handle = w_o.register_forward_pre_hook(lambda m, args: kept.update(x=args[0]))
    with torch.no_grad():
        model(torch.tensor(clean), tgt_in)
    handle.remove()

    def swap(m, args):
        x = args[0].clone()
        x[..., columns] = kept["x"][..., columns]
        return (x,)

    handle = w_o.register_forward_pre_hook(swap)
    try:
        with torch.no_grad():
            return model(torch.tensor(corrupt), tgt_in)
    finally:
        handle.remove()


def test_heads_are_patched_at_the_input_of_w_o(runs, tmp_path):
    out = tmp_path / "out"
    args = ["patch", str(runs["mt"]), "--clean", CLEAN, "--corrupt", CORRUPT, "--heads"]
    result = CliRunner().invoke(
        app, [*args, "--right", "garden", "--wrong", "das", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    record = _written(out)
    for kind in ("encoder", "decoder", "cross"):
        assert (out / f"patching-heads-{kind}.png").read_bytes().startswith(b"\x89PNG")

    # by hand: W^O's input with head h's columns from the clean run (plain torch hooks)
    model, tokenizer = _model(runs["mt"])
    cfg = model.cfg
    right, wrong = tokenizer.encode("garden")[0], tokenizer.encode("das")[0]
    tgt_in = torch.tensor([[cfg.bos_id]])
    clean, corrupt = ([[*tokenizer.encode(t), cfg.eos_id]] for t in (CLEAN, CORRUPT))
    for kind, layer, head in (("cross", 1, 1), ("encoder", 0, 3), ("decoder", 1, 0)):
        stack = model.encoder if kind == "encoder" else model.decoder
        block = stack.layers[layer]
        w_o = (block.cross_attn if kind == "cross" else block.self_attn).out_proj
        columns = slice(head * cfg.d_v, (head + 1) * cfg.d_v)
        logits = _w_o_input_patched(model, w_o, columns, clean, corrupt, tgt_in)[0, -1]
        expected = float(logits[right] - logits[wrong]) - record["corrupt_metric"]
        grid = record["heads"][kind]["effect"]
        assert len(grid) == 2 and len(grid[0]) == cfg.n_heads
        assert expected != 0.0  # the head carries some of the difference
        assert grid[layer][head] == pytest.approx(expected, abs=1e-5)


def _refused(result, *words: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("aiayn: error:"), result.output
    for word in words:
        assert word in errors[0], result.output


@pytest.mark.parametrize("run", ["gpt", "mt"])
def test_texts_of_different_lengths_are_refused_naming_both(runs, tmp_path, run):
    out = tmp_path / "out"
    args = ["patch", str(runs[run]), "--clean", CLEAN, "--corrupt", "garden."]
    result = CliRunner().invoke(
        app, [*args, "--right", "garden", "--wrong", "das", "--out", str(out)]
    )
    _refused(result, "--clean has 5 tokens", "--corrupt 2")
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--right", "house", "--wrong", "das"], ["--right 'house' is 4 tokens"]),
        (["--wrong", "das"], ["give --right"]),
        (["--metric", "logprob"], ["give --target"]),
        (["--metric", "bleu"], ["--metric must be one of", "'bleu'"]),
        (["--right", "garden", "--wrong", "das", "--point", "resid_cross"], ["resid_cross"]),
        (["--right", "garden", "--wrong", "das", "--stack", "encoder"], ["no encoder"]),
    ],
)
def test_bad_options_are_refused_in_one_line(runs, tmp_path, extra, words):
    out = tmp_path / "out"
    args = ["patch", str(runs["gpt"]), "--clean", CLEAN, "--corrupt", CORRUPT, "--out", str(out)]
    _refused(CliRunner().invoke(app, [*args, *extra]), *words)
    assert not out.exists()


def test_a_bert_run_is_refused_by_name(runs, tmp_path):
    out = tmp_path / "out"
    args = ["patch", str(runs["bert"]), "--clean", CLEAN, "--corrupt", CORRUPT, "--out", str(out)]
    _refused(CliRunner().invoke(app, args), "translation and GPT runs", "encoder_only")
    assert not out.exists()
