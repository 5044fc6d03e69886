"""Tasks: the translation task's loss, data and BLEU, and the registry."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from aiayn import ModelConfig, Transformer
from aiayn.config import Precision, TrainConfig
from aiayn.data.batch import Batch
from aiayn.data.batching import TokenBatcher
from aiayn.data.corpus import PreparedCorpus
from aiayn.training.distributed import DistEnv
from aiayn.training.precision import autocast
from aiayn.training.tasks import TASKS, BleuSet, TranslationTask, build_task, evaluate_task
from train_helpers import copy_pairs, make_corpus

CFG = ModelConfig.tiny(vocab_size=13, d_model=32, n_heads=2, d_ff=64, n_layers=1, max_len=32)


def test_translation_loss_is_label_smoothed_cross_entropy_of_the_model_s_logits():
    model = Transformer(CFG).eval()  # no dropout: the two forward passes agree
    task = TranslationTask(CFG)
    batch = Batch.from_pairs(copy_pairs(5, random.Random(0)), CFG.pad_id, CFG.bos_id, CFG.eos_id)
    out = task.loss(model, batch, label_smoothing=0.1)
    logits = model(batch.src, batch.tgt_in).flatten(0, 1)  # (B * T, V)
    target = batch.tgt_out.flatten()
    expected = F.cross_entropy(
        logits, target, ignore_index=CFG.pad_id, label_smoothing=0.1, reduction="sum"
    )
    expected_nll = F.cross_entropy(logits, target, ignore_index=CFG.pad_id, reduction="sum")
    torch.testing.assert_close(out.loss, expected)
    torch.testing.assert_close(out.nll, expected_nll)
    assert out.n_tokens == task.target_tokens(batch) == int((target != CFG.pad_id).sum())


def test_translation_data_from_a_corpus_is_sharded_and_keeps_bleu_sentences(tmp_path):
    corpus = PreparedCorpus.load(make_corpus(tmp_path / "en-de", train_pairs=60))
    tokenizer = corpus.tokenizer()
    cfg = ModelConfig.tiny(vocab_size=tokenizer.vocab_size, max_len=64)
    config = TrainConfig(max_tokens=64, max_steps=1, valid_bleu_sentences=3)
    task = TranslationTask(cfg)
    whole = list(task.build_data(corpus, tokenizer, config, DistEnv()).train.epoch(0))
    shards = [
        list(
            task.build_data(corpus, tokenizer, config, DistEnv(rank=r, world_size=2)).train.epoch(0)
        )
        for r in (0, 1)
    ]
    whole += whole[: len(whole) % 2]  # an odd last round is filled from the start
    for rank, shard in enumerate(shards):
        assert [b.src.tolist() for b in shard] == [b.src.tolist() for b in whole[rank::2]]
    data = task.build_data(corpus, tokenizer, config, DistEnv())
    valid_pairs = sum(b.src.shape[0] for b in data.valid.epoch(0))
    assert valid_pairs == len(corpus.read("valid"))
    assert task.bleu is not None and len(task.bleu.sources) == 3
    assert task.bleu.references == [t for _, t in corpus.read("valid")[:3]]


def test_padding_to_a_length_multiple_leaves_the_loss_unchanged():
    model = Transformer(CFG).eval()
    task = TranslationTask(CFG)
    pairs = copy_pairs(5, random.Random(3))
    specials = (CFG.pad_id, CFG.bos_id, CFG.eos_id)
    tight = task.loss(model, Batch.from_pairs(pairs, *specials), label_smoothing=0.1)
    padded_batch = Batch.from_pairs(pairs, *specials, length_multiple=8)
    assert padded_batch.src.size(1) % 8 == 0 and padded_batch.tgt_out.size(1) % 8 == 0
    padded = task.loss(model, padded_batch, label_smoothing=0.1)
    torch.testing.assert_close(padded.loss, tight.loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded.nll, tight.nll, rtol=1e-5, atol=1e-5)
    assert padded.n_tokens == tight.n_tokens


def test_translation_data_pads_to_the_length_multiple_within_the_positions(tmp_path):
    corpus = PreparedCorpus.load(make_corpus(tmp_path / "en-de", train_pairs=60))
    tokenizer = corpus.tokenizer()
    cfg = ModelConfig.tiny(vocab_size=tokenizer.vocab_size, max_len=12)
    config = TrainConfig(max_tokens=64, max_steps=1, length_multiple=8)
    data = TranslationTask(cfg).build_data(corpus, tokenizer, config, DistEnv())
    batches = [*data.train.epoch(0), *data.valid.epoch(0)]
    # max_len 12 rounds down to 8 positions: a padded side never passes the positions
    for batch in batches:
        assert batch.src.size(1) == batch.tgt_out.size(1) == 8
    with pytest.raises(ValueError, match="length_multiple"):
        TrainConfig(max_tokens=64, max_steps=1, length_multiple=0)


def test_bleu_at_validation_scores_the_detokenized_greedy_outputs():
    model = Transformer(CFG).eval()
    fixed = "the same five words here"  # whatever the model says, it reads as this
    sources = [s for s, _ in copy_pairs(3, random.Random(1))]
    no_autocast = lambda: autocast(Precision.FP32, torch.device("cpu"))  # noqa: E731
    with torch.no_grad():
        assert TranslationTask(CFG).validation_metrics(model, no_autocast) == {}
        same = TranslationTask(CFG, BleuSet(sources, [fixed] * 3, lambda ids: fixed))
        other = TranslationTask(CFG, BleuSet(sources, ["no word in common"] * 3, lambda ids: fixed))
        assert same.validation_metrics(model, no_autocast) == {"bleu": pytest.approx(100.0)}
        assert other.validation_metrics(model, no_autocast) == {"bleu": pytest.approx(0.0)}


def test_the_registry_builds_tasks_by_name_and_names_the_known_ones():
    assert isinstance(build_task("translation", CFG), TranslationTask)
    assert TASKS.get("translation") is TranslationTask
    known = "classify, lm, lm_translation, mlm, translation"
    with pytest.raises(
        ValueError, match=rf"unknown training task 'gan' \(data\.task\); registered: {known}"
    ):
        build_task("gan", CFG)


def test_evaluate_task_gives_the_per_token_cross_entropy_of_all_batches():
    model = Transformer(CFG)
    batches = TokenBatcher(copy_pairs(20, random.Random(2)), 64, 0, 1, 2, shuffle=False)
    no_autocast = lambda: autocast(Precision.FP32, torch.device("cpu"))  # noqa: E731
    metrics = evaluate_task(TranslationTask(CFG), model, batches, torch.device("cpu"), no_autocast)
    assert model.training  # back in train mode
    model.eval()
    with torch.no_grad():
        nll = sum(
            F.cross_entropy(
                model(b.src, b.tgt_in).flatten(0, 1), b.tgt_out.flatten(), ignore_index=0,
                reduction="sum",
            )
            for b in batches.epoch(0)
        )  # fmt: skip
    tokens = sum(b.n_tgt_tokens for b in batches.epoch(0))
    assert len(list(batches.epoch(0))) > 1
    assert metrics["loss"] == pytest.approx(float(nll) / tokens, rel=1e-5)
    assert metrics["ppl"] == pytest.approx(math.exp(metrics["loss"]))
