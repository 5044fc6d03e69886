"""The lm, mlm and lm_translation tasks: batches, masking, losses, and tiny training runs."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import aiayn
from aiayn import ModelConfig
from aiayn.config.recipes import recipes_dir
from aiayn.data.lm import prepare_lm_text
from aiayn.data.prepare import PrepareConfig
from aiayn.inference.search import greedy_search
from aiayn.io.checkpoint import average_last, latest_checkpoint, load_model, load_trainer_state
from aiayn.models import build_model
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_only import EncoderOnly
from aiayn.training.recipe import load_recipe, recipe_from_dict
from aiayn.training.tasks import build_task
from aiayn.training.tasks.lm_translation import SeparatedSource
from aiayn.training.tasks.mlm import Masking, mask_tokens
from aiayn.training.trainer import train_from_recipe
from train_helpers import EN, RECIPE, make_corpus

PAD, BOS, EOS, CLS, SEP, MASK = 0, 1, 2, 4, 5, 6
SPECIALS = (PAD, BOS, EOS, 3, CLS, SEP, MASK)


def masking(vocab_size: int = 100) -> Masking:
    return Masking.for_vocabulary(vocab_size, SPECIALS, MASK, PAD)


# ----- BERT's masking ----------------------------------------------------------------


def test_masking_chooses_15_percent_of_each_sequence_and_never_a_special():
    rng = np.random.default_rng(0)
    ids = rng.integers(7, 100, size=(50, 40))
    ids[:, 0], ids[:, -1], ids[:3, 10:] = CLS, SEP, PAD  # framed, three rows padded
    inputs, labels = mask_tokens(ids, masking(), np.random.default_rng(1))
    chosen = labels != PAD
    eligible = ~np.isin(ids, SPECIALS)
    expected = np.maximum(1, np.rint(0.15 * eligible.sum(1)))  # BERT: round(15%), >= 1
    assert (chosen.sum(1) == expected).all()
    assert not (chosen & ~eligible).any()
    assert (labels[chosen] == ids[chosen]).all()
    assert (inputs[~chosen] == ids[~chosen]).all()  # only chosen positions change


def test_masking_is_80_10_10_within_five_sigma():
    """Of the chosen positions 80% become [MASK], 10% a random ordinary id, 10% stay.

    With n chosen, each share's count is binomial: the test allows 5 standard
    deviations (a false failure about once in 3.5 million runs).
    """
    vocab = 1000
    ids = np.random.default_rng(0).integers(7, vocab, size=(400, 250))
    inputs, labels = mask_tokens(ids, masking(vocab), np.random.default_rng(2))
    chosen = labels != PAD
    n = int(chosen.sum())
    masked = int((inputs[chosen] == MASK).sum())
    kept = int((inputs[chosen] == ids[chosen]).sum())
    replaced = n - masked - kept
    # a random replacement equals the original with probability 1 / (vocab - 7)
    p_kept = 0.1 + 0.1 / (vocab - len(SPECIALS))
    for count, p in ((masked, 0.8), (kept, p_kept), (replaced, 0.1 - 0.1 / (vocab - 7))):
        assert abs(count - n * p) < 5 * math.sqrt(n * p * (1 - p)), (count, n, p)
    random_ids = inputs[chosen & (inputs != MASK) & (inputs != ids)]
    assert not np.isin(random_ids, SPECIALS).any()
    # the random ids are uniform over the ordinary ones: no id far above its share
    counts = np.bincount(random_ids, minlength=vocab)[7:]
    assert counts.max() < replaced / (vocab - 7) + 6 * math.sqrt(replaced / (vocab - 7))


def test_masking_is_reproducible_from_its_seed():
    ids = np.random.default_rng(0).integers(7, 100, size=(8, 30))
    a = mask_tokens(ids, masking(), np.random.default_rng(5))
    b = mask_tokens(ids, masking(), np.random.default_rng(5))
    c = mask_tokens(ids, masking(), np.random.default_rng(6))
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert not (a[1] == c[1]).all()


# ----- the tasks' batches and losses -------------------------------------------------


def test_lm_batch_predicts_the_next_id():
    task = build_task("lm", ModelConfig.gpt(vocab_size=50, max_len=4))
    batch = task.make_batch([[5, 6, 7, 8, 9], [9, 8, 7, 6, 5]], np.random.default_rng(0))
    assert batch.inputs.tolist() == [[5, 6, 7, 8], [9, 8, 7, 6]]
    assert batch.labels.tolist() == [[6, 7, 8, 9], [8, 7, 6, 5]]
    assert task.target_tokens(batch) == 8


def test_lm_translation_batch_and_loss_only_on_the_target():
    cfg = ModelConfig.base(vocab_size=30, architecture="decoder_only", d_model=16, n_heads=2,
                           d_ff=32, n_layers=1, dropout=0.0, max_len=32)  # fmt: skip
    task = build_task("lm_translation", cfg)
    # source 7 8 9, target 10 11: one sequence 7 8 9 <s> 10 11 </s>; a shorter pair padded
    sequences = [[7, 8, 9, BOS, 10, 11, EOS], [12, BOS, 13, EOS]]
    batch = task.make_batch(sequences, np.random.default_rng(0))
    assert batch.inputs.tolist() == [[7, 8, 9, BOS, 10, 11], [12, BOS, 13, PAD, PAD, PAD]]
    assert batch.labels.tolist() == [[PAD, PAD, PAD, 10, 11, EOS], [PAD, 13, EOS, PAD, PAD, PAD]]
    assert task.target_tokens(batch) == 5

    logits = torch.randn(2, 6, 30)

    class Fixed(nn.Module):
        def __init__(self, out: torch.Tensor) -> None:
            super().__init__()
            self.out = out

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.out

    loss = task.loss(Fixed(logits), batch, 0.1)
    target = [(0, 3, 10), (0, 4, 11), (0, 5, EOS), (1, 1, 13), (1, 2, EOS)]
    by_hand = sum(
        -torch.log_softmax(logits[b, t], -1)[y] for b, t, y in target
    )  # the NLL on the five target positions, nothing else
    assert loss.nll.item() == pytest.approx(by_hand.item(), rel=1e-6)
    changed = logits.clone()
    changed[0, :3] = torch.randn(3, 30)  # the positions that would predict the source
    changed[1, 0] = torch.randn(30)
    assert task.loss(Fixed(changed), batch, 0.1).loss.item() == pytest.approx(loss.loss.item())
    changed[0, 3] = torch.randn(30)  # a target position
    assert task.loss(Fixed(changed), batch, 0.1).loss.item() != pytest.approx(loss.loss.item())


def test_separated_source_greedy_equals_generation_by_hand():
    """Greedy translation after source + separator, against the model run on the
    whole sequence at every step (no cache, no search code)."""
    torch.manual_seed(0)
    cfg = ModelConfig.base(vocab_size=30, architecture="decoder_only", d_model=16, n_heads=2,
                           d_ff=32, n_layers=2, dropout=0.0, max_len=12)  # fmt: skip
    model = DecoderOnly(cfg).eval()
    src = torch.tensor([[7, 8, 9], [10, 11, 12]])
    translator = SeparatedSource(model, BOS)
    with torch.no_grad():
        found = greedy_search(translator, src, None, max_output_len=translator.max_output_len(3))
        for row, hypothesis in zip(src, found, strict=True):
            ids, out = [*row.tolist(), BOS], []
            while len(ids) < cfg.max_len:
                logits = model(torch.tensor([ids]))[0, -1]
                logits[[PAD, BOS]] = float("-inf")
                token = int(logits.argmax())
                if token == EOS:
                    break
                out.append(token)
                ids.append(token)
            assert hypothesis[0].tokens == out[: translator.max_output_len(3) - 1]


# ----- tiny training runs ----------------------------------------------------------


@pytest.fixture(scope="module")
def mono(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mono")
    rng = np.random.default_rng(0)

    def text(name: str, n: int) -> Path:
        lines = [" ".join(rng.choice(EN, size=rng.integers(3, 10))) for _ in range(n)]
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        return root / name

    prepare_lm_text(text("train.txt", 300), root / "lm", "en", valid=text("valid.txt", 30),
                    config=PrepareConfig(vocab_size=60))  # fmt: skip
    return root / "lm"


def recipe(corpus: Path, task: str, model: dict, **train):
    settings = dict(max_tokens=64, warmup=10, max_steps=6, checkpoint_every_steps=3,
                    checkpoint_every_minutes=None, keep_last=3, valid_every_steps=3,
                    log_every_steps=1, valid_bleu_sentences=0, seed=0)  # fmt: skip
    small = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=16, dropout=0.1)
    return recipe_from_dict(
        {"data": {"corpus": str(corpus), "task": task}, "model": {**small, **model},
         "train": {**settings, **train}}
    )  # fmt: skip


def valid_records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "valid"]


@pytest.mark.slow
@pytest.mark.trains
def test_lm_trains_logs_perplexity_and_averages(mono, tmp_path):
    result = train_from_recipe(recipe(mono, "lm", {"preset": "gpt"}), tmp_path, progress=False)
    assert (result.steps, result.stopped) == (6, "max_steps")
    records = valid_records(tmp_path)
    assert [r["step"] for r in records] == [3, 6]
    assert records[-1]["ppl"] == pytest.approx(math.exp(records[-1]["loss"]))
    assert records[-1]["loss"] < records[0]["loss"] < math.log(60) + 1
    assert "0.0% of their positions padding" in (tmp_path / "train.log").read_text()
    mean = load_file(average_last(tmp_path, 2))
    a, b = (load_file(tmp_path / f"checkpoints/step-0000000{s}/model.safetensors") for s in (3, 6))
    name = next(iter(mean))
    assert torch.allclose(mean[name], (a[name] + b[name]) / 2)


@pytest.mark.slow
def test_mlm_resumed_run_is_bit_exact_and_logs_masked_accuracy(mono, tmp_path):
    """Stopped after update 3 and resumed to 6 == 6 updates in one go: the masks of
    the resumed updates are drawn exactly as in the uninterrupted run (dropout on)."""
    model = {"preset": "bert"}
    whole = train_from_recipe(recipe(mono, "mlm", model), tmp_path / "a", progress=False)
    first = train_from_recipe(recipe(mono, "mlm", model, max_steps=3), tmp_path / "b",
                              progress=False)  # fmt: skip
    assert first.steps == 3
    second = train_from_recipe(recipe(mono, "mlm", model), tmp_path / "b", progress=False)
    assert (whole.steps, second.steps) == (6, 6)
    assert second.last_valid_loss == whole.last_valid_loss
    a = load_file(tmp_path / "a/checkpoints/step-00000006/model.safetensors")
    b = load_file(tmp_path / "b/checkpoints/step-00000006/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    accuracy = [r["masked_accuracy"] for r in valid_records(tmp_path / "a")]
    assert len(accuracy) == 2 and all(0.0 <= x <= 1.0 for x in accuracy)


@pytest.mark.slow
def test_lm_translation_trains_and_scores_bleu(tmp_path):
    corpus = make_corpus(tmp_path / "en-de")
    model = {"preset": "base", "architecture": "decoder_only", "max_len": 32}
    run = recipe(corpus, "lm_translation", model, max_tokens=128, max_steps=3,
                 valid_bleu_sentences=4)  # fmt: skip
    result = train_from_recipe(run, tmp_path / "run", progress=False)
    assert result.steps == 3 and result.last_valid_bleu is not None
    assert "bleu" in valid_records(tmp_path / "run")[-1]


def test_lm_tasks_refuse_the_wrong_corpus(mono, tmp_path):
    corpus = make_corpus(tmp_path / "en-de")
    with pytest.raises(ValueError, match="parallel corpus"):
        train_from_recipe(recipe(corpus, "lm", {"preset": "gpt"}), tmp_path / "a", progress=False)
    with pytest.raises(ValueError, match="monolingual corpus; translation needs a parallel"):
        model = {"preset": "base", "architecture": "decoder_only"}
        train_from_recipe(recipe(mono, "lm_translation", model), tmp_path / "b", progress=False)
    with pytest.raises(ValueError, match="max_tokens=8 is less than one block of 17"):
        train_from_recipe(recipe(mono, "lm", {"preset": "gpt"}, max_tokens=8), tmp_path / "c",
                          progress=False)  # fmt: skip


@pytest.mark.slow
def test_ctrl_c_saves_a_loadable_mlm_checkpoint(mono, tmp_path):
    """The trainer's Ctrl-C handling holds for the new tasks: the first SIGINT saves a
    checkpoint of the encoder-only model and exits 130."""
    src = str(Path(aiayn.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [
        sys.executable, "-m", "aiayn.cli", "train", str(RECIPE), f"data.corpus={mono}",
        "data.task=mlm", "model.preset=bert", "model.max_len=16", "train.max_tokens=64",
        "train.max_steps=100000", "train.checkpoint_every_steps=null", "train.log_every_steps=1",
        "train.valid_every_steps=null", "train.valid_bleu_sentences=0",
        "--run", str(tmp_path), "--device", "cpu", "--no-progress",
    ]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    metrics = tmp_path / "metrics.jsonl"
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stdout + stderr
    checkpoint = latest_checkpoint(tmp_path)
    assert checkpoint is not None
    model = load_model(checkpoint / "model.safetensors")
    assert isinstance(model, EncoderOnly)
    assert load_trainer_state(checkpoint)["state"]["step"] >= 2


def test_the_shipped_recipes_load_and_the_translators_have_the_same_size(tmp_path):
    """configs/gpt-translate-bible-en-es-cpu.yaml's decoder-only model holds as many
    parameters as configs/bible-en-es-cpu.yaml's encoder-decoder (within 0.1%)."""
    sizes = {}
    for name, task in [("gpt-bible-en-cpu", "lm"), ("bert-bible-en-cpu", "mlm"),
                       ("gpt-translate-bible-en-es-cpu", "lm_translation"),
                       ("bible-en-es-cpu", "translation")]:  # fmt: skip
        recipe = load_recipe(recipes_dir() / f"{name}.yaml", [f"data.corpus={tmp_path}"])
        assert recipe.task == task
        with torch.device("meta"):
            sizes[name] = build_model(recipe.model_config(8000, PAD, BOS, EOS)).num_parameters()
    decoder_only, encoder_decoder = sizes["gpt-translate-bible-en-es-cpu"], sizes["bible-en-es-cpu"]
    assert abs(decoder_only / encoder_decoder - 1) < 1e-3, sizes
