"""Language modelling, GPT's task: predict every next token of packed text.

data:        a monolingual corpus's documents -> one id stream (eos after each)
             -> blocks of max_len + 1 ids, consecutive blocks sharing one id
             (`aiayn.data.lm.pack`): no padding, every id a target once
loss:        network(block[:-1]) -> logits -> label-smoothed cross-entropy on block[1:]
validation:  the loss and its perplexity (`evaluate_task` logs both)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from torch import nn

from aiayn.config import ModelConfig, TrainConfig
from aiayn.data.lm import MakeBatch, SequenceBatches, TokenBatch, pack, padded, read_documents
from aiayn.training.loss import LossOutput, label_smoothed_cross_entropy
from aiayn.training.tasks.base import Autocast, TaskData, register_task

if TYPE_CHECKING:
    from collections.abc import Sequence

    from aiayn.data.corpus import PreparedCorpus
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.training.distributed import DistEnv

log = logging.getLogger(__name__)


def token_loss(
    network: nn.Module, batch: TokenBatch, pad_id: int, label_smoothing: float
) -> LossOutput:
    """network(inputs) -> label-smoothed cross-entropy on the positions with a label."""
    logits = network(batch.inputs)  # (B, T, V)
    return label_smoothed_cross_entropy(logits, batch.labels, pad_id, label_smoothing)


def check_budget(config: TrainConfig, length: int, what: str) -> None:
    """Refuse a token budget smaller than one sequence of `length` ids.

    Raises:
        ValueError: naming train.max_tokens and the sequence length.
    """
    if config.max_tokens < length:
        raise ValueError(
            f"train.max_tokens={config.max_tokens} is less than one {what} of {length} ids; "
            "raise train.max_tokens or lower model.max_len"
        )


def packed_batches(
    corpus: PreparedCorpus,
    tokenizer: Tokenizer,
    config: TrainConfig,
    env: DistEnv,
    length: int,
    overlap: int,
    make: MakeBatch,
    task: str,
) -> TaskData:
    """The corpus's train and valid documents packed into blocks of `length` ids.

    Training batches are shuffled and sharded by rank; validation batches are in
    order and unsharded (None when the valid split fills no block). The blocks, the
    ids left out at the end and the padding share are logged.
    """
    check_budget(config, length, "block")
    splits = {}
    for split in ("train", "valid"):
        documents = tokenizer.encode_batch(read_documents(corpus, split))
        packed = pack(documents, tokenizer.eos_id, length, overlap)
        if split == "train" and not packed.blocks:
            raise ValueError(
                f"{corpus.root}: the training split ({packed.stream_tokens} ids) fills no "
                f"block of {length} ids; lower model.max_len"
            )
        if not packed.blocks:
            log.warning("%s: the valid split fills no block of %d ids: no validation", task, length)
            splits[split] = None
            continue
        shard = {"rank": env.rank, "world_size": env.world_size} if split == "train" else {}
        splits[split] = batches = SequenceBatches(
            packed.blocks, make, config.max_tokens, tokenizer.pad_id,
            seed=config.seed, shuffle=split == "train", **shard,
        )  # fmt: skip
        log.info(
            "%s %s: %d blocks of %d ids from %d documents (%d ids left out at the end), "
            "%d batches, padding %.1f%%",
            task, split, len(packed.blocks), length, len(documents), packed.left_out,
            len(batches), 100 * batches.padding_fraction(),
        )  # fmt: skip
    return TaskData(train=splits["train"], valid=splits["valid"])


@register_task
class LanguageModelTask:
    """A decoder-only model learns to predict the next token (see `aiayn.training.tasks.base.Task`).

    Args:
        cfg: the model's config: `max_len` is the block length the model reads.
    """

    name: ClassVar[str] = "lm"

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg

    def build_data(
        self, corpus: PreparedCorpus, tokenizer: Tokenizer, config: TrainConfig, env: DistEnv
    ) -> TaskData:
        """Blocks of max_len + 1 ids, consecutive ones sharing an id, in token-budget batches."""
        return packed_batches(
            corpus, tokenizer, config, env, self.cfg.max_len + 1, 1, self.make_batch, self.name
        )

    def make_batch(self, blocks: Sequence[Sequence[int]], rng: np.random.Generator) -> TokenBatch:
        """Inputs block[:-1], labels block[1:] (`rng` is not needed: nothing is drawn)."""
        ids = padded(blocks, self.cfg.pad_id)  # (B, T + 1)
        labels = ids[:, 1:]
        return TokenBatch(ids[:, :-1], labels, int((labels != self.cfg.pad_id).sum()))

    def loss(self, network: nn.Module, batch: TokenBatch, label_smoothing: float) -> LossOutput:
        """Every position predicts the next id."""
        return token_loss(network, batch, self.cfg.pad_id, label_smoothing)

    def target_tokens(self, batch: TokenBatch) -> int:
        """Positions with a next id: every input position of a packed block."""
        return batch.n_targets

    def validation_metrics(self, model: nn.Module, autocast: Autocast) -> dict[str, float]:
        """{}: the validation perplexity comes with the loss (`evaluate_task`)."""
        return {}
