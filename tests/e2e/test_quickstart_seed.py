"""`aiayn quickstart --seed`, the budget in results.json and the reference line, on a tiny
corpus put where the quickstart looks for its prepared Bible (no SWORD modules needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

import aiayn.apps.quickstart
from aiayn.apps.quickstart import QuickstartConfig, Scoring, reference_line
from aiayn.cli import app
from aiayn.data.batching import TokenBatcher
from train_helpers import QUICKSTART_VOCAB, RECIPE, tiny_quickstart

runner = CliRunner()


def quickstart(out: Path, *extra: str) -> tuple[dict, str]:
    """A few steps of the tiny recipe through the CLI, with dropout (so that the seed
    shows in the masks) and the best checkpoint scored; results.json and the output."""
    return tiny_quickstart(out, "--average", "1", "--set", "model.dropout=0.1", *extra)


def final_weights(out: Path) -> dict:
    (last,) = sorted((out / "run" / "checkpoints").glob("step-*"))[-1:]
    return load_file(last / "model.safetensors")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("seeds")
    made = {}
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        made[name] = (base / name, *quickstart(base / name, "--seed", seed))
    return made


def test_same_seed_same_weights_other_seed_other_weights(runs):
    (a, results_a, output_a), (b, results_b, _), (c, results_c, _) = (
        runs["a"],
        runs["b"],
        runs["c"],
    )
    assert (results_a["seed"], results_b["seed"], results_c["seed"]) == (1, 1, 2)
    assert "seed 1" in output_a
    wa, wb, wc = final_weights(a), final_weights(b), final_weights(c)
    assert wa.keys() == wc.keys()
    assert all((wa[k] == wb[k]).all() for k in wa)
    assert any(not (wa[k] == wc[k]).all() for k in wa)
    assert results_a["budget"] == {**results_b["budget"], **_timed(results_a["budget"])}


def _timed(budget: dict) -> dict:
    """The budget's entries that depend on timing (they differ between identical runs)."""
    timed = (
        "train_minutes",
        "train_seconds",
        "tokens_per_s",
        "tgt_tokens_per_s",
        "achieved_gflops",
        "peak",
    )
    return {k: budget[k] for k in timed}


def test_the_budget_counts_the_batches_the_run_read(runs):
    out, results, output = runs["a"]
    budget = results["budget"]
    assert budget["steps"] == results["steps"] == 6
    assert budget["batches"] == 6  # accumulation 1: one batch per step
    # The tokens of the run's first six batches, counted on the batches themselves.
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.training.tasks.translation import encode_pairs

    corpus = PreparedCorpus.load(out / "data")
    tokenizer = corpus.tokenizer()
    pairs = encode_pairs(tokenizer, corpus.read("train"))
    specials = (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
    batcher = TokenBatcher(pairs, 256, *specials, seed=1)
    assert len(batcher) > 6  # the six steps read part of the first epoch
    read = list(batcher.epoch(0))[:6]
    assert budget["tgt_tokens"] == sum(b.n_tgt_tokens for b in read)
    assert budget["src_tokens"] == sum(int((b.src != tokenizer.pad_id).sum()) for b in read)
    seconds = budget["train_seconds"]
    assert seconds / 60 == pytest.approx(budget["train_minutes"], abs=0.01)
    assert budget["tgt_tokens_per_s"] == pytest.approx(budget["tgt_tokens"] / seconds, rel=0.05)
    total = budget["src_tokens"] + budget["tgt_tokens"]
    assert budget["tokens_per_s"] == pytest.approx(total / seconds, rel=0.05)
    assert budget["matmul_flops_per_tgt_token"] == round(
        budget["matmul_flops"] / budget["tgt_tokens"]
    )
    fp32 = budget["peak"]["float32"]
    assert fp32["shape"] == [1024, 1024, 1024] and fp32["gflops"] > 0
    # Recomputed from the unrounded FLOPs: the recorded GFLOP/s is rounded to 0.1, which on a
    # six-step run of a few GFLOP/s moves the percentage by more than its own rounding; and
    # the recorded seconds are rounded to the millisecond, which on a fast CPU (six steps in
    # tens of milliseconds) moves the rate by a percent or more.
    flops = budget["matmul_flops"]
    low = flops / (seconds + 0.0005) / 1e9  # the rate over the seconds' rounding interval
    high = flops / max(seconds - 0.0005, 1e-9) / 1e9
    assert low - 0.051 <= budget["achieved_gflops"] <= high + 0.051
    percent = [100 * rate / fp32["gflops"] for rate in (low, high)]  # the peak's own 0.1 too
    assert percent[0] * 0.99 - 0.051 <= fp32["percent_reached"] <= percent[1] * 1.01 + 0.051
    assert output.count("budget: 6 steps") == 1


def test_a_run_resumes_only_with_its_own_seed(runs):
    out = runs["c"][0]
    result = runner.invoke(
        app,
        [
            "quickstart", "--out", str(out), "--recipe", str(RECIPE), "--device", "cpu",
            "--vocab-size", str(QUICKSTART_VOCAB), "--seed", "3", "--set", "train.max_steps=6",
            "--set", "train.valid_bleu_sentences=0", "--set", "model.dropout=0.1",
        ],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "trained with seed 2, not 3" in result.output and "(--seed 2)" in result.output


def test_seed_and_a_seed_override_are_refused_together():
    with pytest.raises(ValueError, match=r"both set train\.seed"):
        QuickstartConfig(seed=1, overrides=("train.seed=2",))


def test_reference_line_from_the_packaged_file(monkeypatch, tmp_path):
    scored = Scoring(8, 1.0, "best")
    path = tmp_path / "quickstart-reference.json"
    monkeypatch.setattr(aiayn.apps.quickstart, "reference_file", lambda: path)
    assert reference_line("x/bible-en-es-cpu.yaml", 15, "cpu", scored) == (
        "reference: none recorded yet for bible-en-es-cpu.yaml at 15 minutes on cpu "
        "with beam 8, alpha 1, weights best"
    )
    entry = {"recipe": "bible-en-es-cpu.yaml", "minutes": 15, "device": "cpu"}
    entry |= {"machine": "a 2-core Xeon", "bleu": [21.5, 19.25, 24.0]}
    entry |= {"beam": 8, "alpha": 1.0, "weights": "best"}
    path.write_text(json.dumps({"references": [entry]}), encoding="utf-8")
    assert reference_line("x/bible-en-es-cpu.yaml", 15.0, "cpu", scored) == (
        "reference on a 2-core Xeon: median 21.50 BLEU (range 19.25-24.00) over 3 seeds, "
        "15 minutes, beam 8, alpha 1, weights best"
    )
    assert reference_line("x/bible-en-es-cpu.yaml", 30, "cpu", scored).startswith("reference: none")
    assert reference_line("x/bible-en-es-cpu.yaml", 15, "cuda:0", scored).startswith(
        "reference: none"
    )
    # a run with other settings is not compared with the recipe's own runs
    bf16 = ("train.precision=auto",)
    assert reference_line("x/bible-en-es-cpu.yaml", 15, "cpu", scored, bf16) == (
        "reference: none recorded yet for bible-en-es-cpu.yaml train.precision=auto "
        "at 15 minutes on cpu with beam 8, alpha 1, weights best"
    )
    entry = {**entry, "overrides": ["train.precision=auto"], "bleu": [19.0]}
    path.write_text(json.dumps({"references": [entry]}), encoding="utf-8")
    assert reference_line("x/bible-en-es-cpu.yaml", 15, "cpu", scored, bf16).endswith(
        "over 1 seed, 15 minutes, beam 8, alpha 1, weights best"
    )
    assert reference_line("x/bible-en-es-cpu.yaml", 15, "cpu", scored).startswith("reference: none")


def test_the_train_longer_hint_keeps_the_seed(monkeypatch, tmp_path):
    import shlex

    asked: list[QuickstartConfig] = []
    monkeypatch.setattr(
        aiayn.apps.quickstart, "run_quickstart", lambda config, echo: asked.append(config)
    )
    args = [
        "quickstart",
        "--out",
        str(tmp_path),
        "--minutes",
        "2",
        "--device",
        "cpu",
        "--seed",
        "7",
    ]
    assert runner.invoke(app, args).exit_code == 0
    assert asked[0].seed == 7
    hint = shlex.split(aiayn.apps.quickstart.train_longer_command(asked[0]))
    assert runner.invoke(app, hint[1:]).exit_code == 0
    assert asked[1] == QuickstartConfig(**{**vars(asked[0]), "minutes": 4.0})
