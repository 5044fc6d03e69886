"""Language modelling, GPT's task: predict every next token of packed text.

data:        a monolingual corpus's documents -> one id stream (eos after each)
             -> blocks of max_len + 1 ids, consecutive blocks sharing one id
             (`aiayn.data.lm.pack`): no padding, every id a target once
loss:        network(block[:-1]) -> logits -> label-smoothed cross-entropy on block[1:]
validation:  the loss and its perplexity (`evaluate_task` logs both), and the
             in-context loss (Olsson et al. 2022): the mean unsmoothed loss at the
             block positions in the late window minus that in the early window
             (`in_context_loss`). Positions are 0-based input positions t of a block
             of T = max_len, position t predicting id t + 1; a window (a, b) holds
             the positions floor(a*T) <= t < ceil(b*T). By default early is
             (0.05, 0.15), the tenth of the block centred on its first tenth, and
             late (0.9, 1.0), its last tenth: Olsson et al.'s "loss at token 500
             minus loss at token 50" for blocks of 500. Negative when the model
             predicts later tokens better, from the context before them.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import ModelConfig, TrainConfig
from aiayn.data.lm import MakeBatch, SequenceBatches, TokenBatch, pack, padded, read_documents
from aiayn.training.loss import LossOutput, network_loss
from aiayn.training.tasks.base import Autocast, TaskData, register_task

if TYPE_CHECKING:
    from collections.abc import Sequence

    from aiayn.data.corpus import PreparedCorpus
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.training.distributed import DistEnv
    from aiayn.training.tasks.base import Batches

log = logging.getLogger(__name__)

EARLY_WINDOW = (0.05, 0.15)
LATE_WINDOW = (0.9, 1.0)


def window_positions(window: Any, length: int, name: str) -> range:
    """The positions floor(a*length) <= t < ceil(b*length) of the window (a, b).

    Raises:
        ValueError: `window` is not two numbers 0 <= a < b <= 1, naming the option.
    """
    pair = tuple(window) if isinstance(window, list | tuple) else ()
    if len(pair) != 2 or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in pair
    ):
        raise ValueError(
            f"data.task_options: lm {name} must be two fractions [a, b], got {window!r}"
        )
    a, b = pair
    if not 0 <= a < b <= 1:
        raise ValueError(f"data.task_options: lm {name} must have 0 <= a < b <= 1, got [{a}, {b}]")
    return range(math.floor(a * length), math.ceil(b * length))


def in_context_loss(
    logits: Tensor, labels: Tensor, pad_id: int, early: range, late: range
) -> tuple[float, float, float, float]:
    """Unsmoothed cross-entropy summed and counted over the `early` and `late` positions.

    Args:
        logits: (B, T, V) next-token logits.
        labels: (B, T) next ids, `pad_id` where there is none.
        pad_id: the label of positions without a target.
        early, late: the positions of the two windows (`window_positions`).

    Returns:
        (early_sum, early_count, late_sum, late_count).
    """
    nll = F.cross_entropy(
        logits.float().transpose(1, 2), labels, ignore_index=pad_id, reduction="none"
    )  # (B, T)
    real = labels != pad_id
    sums = []
    for window in (early, late):
        cols = slice(window.start, min(window.stop, labels.shape[1]))
        sums += [float(nll[:, cols].sum()), int(real[:, cols].sum())]
    return sums[0], sums[1], sums[2], sums[3]


def token_loss(
    network: nn.Module, batch: TokenBatch, pad_id: int, label_smoothing: float
) -> LossOutput:
    """network(inputs) -> label-smoothed cross-entropy on the positions with a label (the
    projection to the vocabulary fused with the loss: `network_loss`)."""
    return network_loss(network, (batch.inputs,), batch.labels, pad_id, label_smoothing)


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
        in_context_early, in_context_late: the in-context loss's windows [a, b] as
            fractions of the block (module docstring), the task's options (a recipe's
            `data.task_options`).

    Raises:
        ValueError: a window that is not 0 <= a < b <= 1.
    """

    name: ClassVar[str] = "lm"
    options: ClassVar[tuple[str, ...]] = ("in_context_early", "in_context_late")

    def __init__(
        self,
        cfg: ModelConfig,
        in_context_early: Any = EARLY_WINDOW,
        in_context_late: Any = LATE_WINDOW,
    ) -> None:
        self.cfg = cfg
        self.early = window_positions(in_context_early, cfg.max_len, "in_context_early")
        self.late = window_positions(in_context_late, cfg.max_len, "in_context_late")
        self.valid: Batches | None = None

    def build_data(
        self, corpus: PreparedCorpus, tokenizer: Tokenizer, config: TrainConfig, env: DistEnv
    ) -> TaskData:
        """Blocks of max_len + 1 ids, consecutive ones sharing an id, in token-budget batches."""
        data = packed_batches(
            corpus, tokenizer, config, env, self.cfg.max_len + 1, 1, self.make_batch, self.name
        )
        self.valid = data.valid
        return data

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
        """{"in_context_loss": late-window loss - early-window loss, "early_loss",
        "late_loss"} over the valid blocks (the module docstring defines the windows);
        the perplexity comes with the loss (`evaluate_task`). {} without valid blocks."""
        if self.valid is None:
            return {}
        device = next(model.parameters()).device
        totals = [0.0, 0, 0.0, 0]
        with torch.no_grad():
            for batch in self.valid.epoch(0):
                batch = batch.to(device)
                with autocast():
                    logits = model(batch.inputs)  # (B, T, V)
                sums = in_context_loss(logits, batch.labels, self.cfg.pad_id, self.early, self.late)
                totals = [t + s for t, s in zip(totals, sums, strict=True)]
        if not totals[1] or not totals[3]:
            return {}
        early, late = totals[0] / totals[1], totals[2] / totals[3]
        return {"in_context_loss": late - early, "early_loss": early, "late_loss": late}
