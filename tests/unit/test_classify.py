"""Sequence classification: the pooled encoder (mean and first) against its formula written out, the
task's loss against F.cross_entropy on the class rows, its batches against the corpus,
and a tiny model learning a separable task (through the task's own loss and metric)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aiayn import ModelConfig, build_model
from aiayn.config import TrainConfig
from aiayn.data.classification import class_piece, write_classification_corpus
from aiayn.data.corpus import PreparedCorpus
from aiayn.io.checkpoint import load_model, resolve_weights
from aiayn.models.encoder_classifier import EncoderClassifier
from aiayn.training.distributed import DistEnv
from aiayn.training.tasks import build_task
from aiayn.training.trainer import train_from_recipe


def config(vocab_size, **overrides):
    settings = dict(architecture="encoder_classifier", d_model=32, n_heads=4, d_ff=64,
                    n_layers=2, max_len=24, dropout=0.0, attention_dropout=0.0,
                    type_vocab_size=0)  # fmt: skip
    return ModelConfig.bert(vocab_size, **{**settings, **overrides})


def test_the_head_reads_the_mean_of_the_real_positions():
    model = build_model(config(30)).eval()
    assert type(model) is EncoderClassifier
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])  # pad id 0
    with torch.no_grad():
        scores = model(ids)
        states = model.encode(ids)
        expected = [
            model.project(model.mlm_head(states[0].mean(0))),
            model.project(model.mlm_head(states[1, :2].mean(0))),
        ]
        torch.testing.assert_close(scores, torch.stack(expected))
        longer = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], dim=1)
        torch.testing.assert_close(model(longer), scores)  # more padding changes nothing
    assert scores.shape == (2, 30)


def test_first_pooling_reads_position_0_and_unknown_poolings_are_refused():
    model = build_model(config(30, pooling="first")).eval()
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    with torch.no_grad():
        states = model.encode(ids)
        torch.testing.assert_close(model(ids), model.project(model.mlm_head(states[:, 0])))
        mean = build_model(config(30)).eval()
        mean.load_state_dict(model.state_dict())
        assert not torch.allclose(mean(ids), model(ids))  # the setting changes the reading
    with pytest.raises(ValueError, match="pooling must be one of mean, first, got 'cls'"):
        config(30, pooling="cls")


def corpus(tmp_path, n_train=120):
    """Texts of 3-12 words from {x, y, z} with one "red" or "blue" inside: the class."""
    rng = random.Random(0)

    def example():
        label = rng.choice(["red", "blue"])
        words = [rng.choice("xyz") for _ in range(rng.randint(2, 11))]
        words.insert(rng.randrange(len(words) + 1), label)
        return " ".join(words), label

    splits = {"train": [example() for _ in range(n_train)], "valid": [example() for _ in range(40)]}
    symbols = ["\u2581" + word for word in ("x", "y", "z", "red", "blue")]
    write_classification_corpus(tmp_path, splits, ["red", "blue"], "bpe", 11, symbols)
    return PreparedCorpus.load(tmp_path), splits


def test_batches_hold_every_text_with_its_class(tmp_path):
    data, splits = corpus(tmp_path)
    tokenizer = data.tokenizer()
    cfg = config(tokenizer.vocab_size, max_len=8)
    task = build_task("classify", cfg)
    built = task.build_data(
        data, tokenizer, TrainConfig(max_tokens=64, seed=1, max_steps=1), DistEnv()
    )
    seen = []
    for batch in built.train.epoch(0):
        assert batch.inputs.numel() <= 64 and batch.labels.shape == (len(batch.inputs), 1)
        for row, label in zip(batch.inputs.tolist(), batch.labels[:, 0].tolist(), strict=True):
            seen.append((tuple(i for i in row if i != cfg.pad_id), label))
    expected = [
        (tuple(tokenizer.encode(text)[:8]), ["red", "blue"].index(label))
        for text, label in splits["train"]
    ]
    assert sorted(seen) == sorted(expected)  # texts cut to max_len, labels by class order
    assert task.class_ids.tolist() == [
        next(i for i in range(tokenizer.vocab_size) if tokenizer.id_to_piece(i) == class_piece(c))
        for c in (0, 1)
    ]


def test_the_loss_is_cross_entropy_over_the_class_rows(tmp_path):
    data, _ = corpus(tmp_path)
    tokenizer = data.tokenizer()
    task = build_task("classify", config(tokenizer.vocab_size))
    built = task.build_data(data, tokenizer, TrainConfig(max_tokens=64, max_steps=1), DistEnv())
    model = build_model(config(tokenizer.vocab_size)).eval()
    batch = next(iter(built.train.epoch(0)))
    out = task.loss(model, batch, 0.1)
    scores = model(batch.inputs)[:, task.class_ids]
    expected = F.cross_entropy(scores, batch.labels[:, 0], label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(out.loss, expected)
    assert int(out.n_tokens) == task.target_tokens(batch) == len(batch.inputs)


def test_a_tiny_model_learns_a_separable_task(tmp_path):
    data, _ = corpus(tmp_path)
    tokenizer = data.tokenizer()
    cfg = config(tokenizer.vocab_size)
    task = build_task("classify", cfg)
    built = task.build_data(data, tokenizer, TrainConfig(max_tokens=64, max_steps=1), DistEnv())
    torch.manual_seed(0)
    model = build_model(cfg)
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    no_autocast = torch.autocast("cpu", enabled=False)
    with torch.no_grad():
        before = task.validation_metrics(model.eval(), lambda: no_autocast)["accuracy"]
    model.train()
    for epoch in range(5):  # 85 updates
        for batch in built.train.epoch(epoch):
            out = task.loss(model, batch, 0.0)
            optimiser.zero_grad()
            (out.loss / out.n_tokens).backward()
            optimiser.step()
    with torch.no_grad():
        after = task.validation_metrics(model.eval(), lambda: no_autocast)["accuracy"]
    assert after >= 0.9 and after > before


def test_a_corpus_without_classes_is_refused_by_name(tmp_path):
    (tmp_path / "corpus.json").write_text('{"src_lang": "en", "tgt_lang": "es", "tokenizer": "x"}')
    task = build_task("classify", config(30))
    with pytest.raises(ValueError, match="lists no classes: not a classification corpus"):
        task.build_data(
            PreparedCorpus.load(tmp_path), None, TrainConfig(max_tokens=64, max_steps=1), DistEnv()
        )


@pytest.mark.trains
def test_the_listops_recipe_trains_a_classifier_end_to_end(tmp_path):
    """The packaged recipe through the trainer (a tiny model on the corpus above, with a
    Performer kernel): updates, a validation with its accuracy, a loadable model."""
    (tmp_path / "data").mkdir()
    data, _ = corpus(tmp_path / "data")
    recipe = Path(__file__).resolve().parents[2] / "configs" / "listops-cpu.yaml"
    small = ["model.d_model=16", "model.d_ff=32", "model.n_layers=1", "model.max_len=16"]
    limits = ["train.max_steps=3", "train.valid_every_steps=3", "train.max_tokens=128"]
    result = train_from_recipe(
        recipe,
        tmp_path / "run",
        [f"data.corpus={data.root}", "model.attention=performer", *small, *limits],
        progress=False,
    )
    assert result.steps == 3
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    valid = [r for r in records if r["kind"] == "valid"]
    assert valid and 0.0 <= valid[-1]["accuracy"] <= 1.0
    model = load_model(resolve_weights(tmp_path / "run"))
    assert type(model) is EncoderClassifier and model.cfg.attention == "performer"
