"""Sequence classification: which class a whole text belongs to (Long Range Arena's ListOps
and text tasks, offline: `aiayn prepare listops`, `aiayn prepare bible-books`).

data:        a classification corpus (`aiayn.data.classification`): each text's ids, cut
             to the model's max_len (the cut ones are counted in the log), and its class
             index; batched by token budget, shuffled by epoch and sharded by rank
             (`aiayn.data.lm.SequenceBatches`)
model:       an encoder with a mean-pooled head (`aiayn.models.encoder_classifier`),
             whose scores over the vocabulary are read at the class pieces' rows
loss:        label-smoothed cross-entropy over the classes, one target per text
validation:  the loss, and accuracy (argmax over the classes = the label)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig, TrainConfig
from aiayn.data.classification import class_piece, read_classes
from aiayn.data.lm import SequenceBatches, TokenBatch, padded
from aiayn.training.loss import LossOutput, label_smoothed_cross_entropy
from aiayn.training.tasks.base import Autocast, Batches, TaskData, register_task
from aiayn.training.tasks.lm import check_budget

if TYPE_CHECKING:
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.training.distributed import DistEnv

log = logging.getLogger(__name__)


def class_ids(tokenizer: Tokenizer, n_classes: int) -> list[int]:
    """The vocabulary ids of the class pieces "<class:0>" ... in class order.

    Raises:
        ValueError: a class piece missing from the vocabulary (naming it).
    """
    ids = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    missing = [class_piece(c) for c in range(n_classes) if class_piece(c) not in ids]
    if missing:
        raise ValueError(
            f"the tokenizer {tokenizer.path} has no piece {missing[0]!r}: not the model of a "
            "classification corpus"
        )
    return [ids[class_piece(c)] for c in range(n_classes)]


@register_task
class ClassificationTask:
    """An encoder classifies whole texts (see `aiayn.training.tasks.base.Task`).

    Args:
        cfg: the model's config: texts are cut to `max_len` ids.
    """

    name: ClassVar[str] = "classify"
    options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self.class_ids: Tensor | None = None  # (C,) vocabulary ids of the class pieces
        self.valid: Batches | None = None

    def build_data(
        self, corpus: PreparedCorpus, tokenizer: Tokenizer, config: TrainConfig, env: DistEnv
    ) -> TaskData:
        """Each split's texts as ids followed by their class index (`make_batch` splits them)."""
        check_budget(config, self.cfg.max_len, "text")
        classes = read_classes(corpus)
        self.class_ids = torch.tensor(class_ids(tokenizer, len(classes)))
        index = {name: i for i, name in enumerate(classes)}
        splits: dict[str, Batches | None] = {}
        for split in ("train", "valid"):
            examples = corpus.read(split)
            if not examples:
                if split == "train":
                    raise ValueError(f"{corpus.root}: the training split holds no text")
                splits[split] = None
                continue
            rows = tokenizer.encode_batch([text for text, _ in examples])
            cut = sum(len(row) > self.cfg.max_len for row in rows)
            if cut:
                log.info("classify: %d of %d %s texts cut to %d ids", cut, len(rows), split,
                         self.cfg.max_len)  # fmt: skip
            sequences = [
                [*row[: self.cfg.max_len], index[label]]
                for row, (_, label) in zip(rows, examples, strict=True)
            ]
            shard = {"rank": env.rank, "world_size": env.world_size} if split == "train" else {}
            splits[split] = SequenceBatches(
                sequences, self.make_batch, config.max_tokens, self.cfg.pad_id,
                seed=config.seed, shuffle=split == "train", **shard,
            )  # fmt: skip
        self.valid = splits["valid"]
        return TaskData(train=splits["train"], valid=splits["valid"])

    def make_batch(
        self, sequences: Sequence[Sequence[int]], rng: np.random.Generator
    ) -> TokenBatch:
        """(B, T) padded texts and (B, 1) class indices from "ids..., class" sequences."""
        inputs = padded([s[:-1] for s in sequences], self.cfg.pad_id)
        labels = torch.tensor([[s[-1]] for s in sequences], dtype=torch.long)
        return TokenBatch(inputs, labels, len(sequences))

    def scores(self, network: nn.Module, inputs: Tensor) -> Tensor:
        """(B, C) class scores: the network's (B, V) scores at the class pieces."""
        if self.class_ids is None:
            raise RuntimeError("ClassificationTask.build_data must run before scores")
        return network(inputs)[:, self.class_ids.to(inputs.device)]

    def loss(self, network: nn.Module, batch: TokenBatch, label_smoothing: float) -> LossOutput:
        """Cross-entropy over the classes, one target per text."""
        scores = self.scores(network, batch.inputs)[:, None, :]  # (B, 1, C)
        return label_smoothed_cross_entropy(scores, batch.labels, -1, label_smoothing)

    def target_tokens(self, batch: TokenBatch) -> int:
        """The texts of the batch."""
        return batch.n_targets

    def validation_metrics(self, model: nn.Module, autocast: Autocast) -> dict[str, float]:
        """{"accuracy": share of valid texts whose best-scored class is theirs}."""
        if self.valid is None:
            return {}
        device = next(model.parameters()).device
        correct = total = 0
        for batch in self.valid.epoch(0):
            batch = batch.to(device)
            with autocast():
                guess = self.scores(model, batch.inputs).argmax(-1)  # (B,)
            correct += int((guess == batch.labels[:, 0]).sum())
            total += batch.n_targets
        return {"accuracy": correct / total}
