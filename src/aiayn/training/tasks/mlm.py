"""Masked language modelling, BERT's task (Devlin et al. 2019, section 3.1, appendix A.1).

data:        a monolingual corpus packed into blocks (`aiayn.data.lm.pack`), each framed
             as [CLS] block [SEP] to the model's max_len (framing optional)
masking:     per sequence, 15% of the positions that are not special (round, at least
             one) are chosen; of those 80% become [MASK], 10% a random ordinary piece,
             10% stay as they are. Drawn when a batch is made, from a generator seeded
             by (seed, epoch, batch), so a resumed run masks exactly as an uninterrupted
             one; the valid split's masks are drawn once per batch the same way and so
             are the same at every validation.
loss:        network(masked) -> label-smoothed cross-entropy on the chosen positions only
validation:  the loss, and masked-token accuracy (argmax = original at chosen positions)

Departures from BERT: no next-sentence prediction (later work, e.g. RoBERTa, drops it
too), and the random replacement is drawn from the ordinary pieces, never a special one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from torch import nn

from aiayn.config import ModelConfig, TrainConfig
from aiayn.data.lm import CLS, MASK, SEP, TokenBatch, padded, symbol_ids
from aiayn.training.loss import LossOutput
from aiayn.training.tasks.base import Autocast, Batches, TaskData, register_task
from aiayn.training.tasks.lm import packed_batches, token_loss

if TYPE_CHECKING:
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.training.distributed import DistEnv

log = logging.getLogger(__name__)


def check_rates(select: float, to_mask: float, to_random: float) -> None:
    """Refuse masking rates outside [0, 1], or to_mask + to_random above 1.

    Raises:
        ValueError: naming the rate (the task's option) and its range.
    """
    rates = {"select": select, "to_mask": to_mask, "to_random": to_random}
    for name, value in rates.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ValueError(f"data.task_options: mlm {name} must be in [0, 1], got {value!r}")
    if to_mask + to_random > 1:
        raise ValueError(
            "data.task_options: mlm to_mask + to_random must be at most 1 (the rest stay as "
            f"they are), got {to_mask} + {to_random}"
        )


@dataclass(frozen=True)
class Masking:
    """BERT's masking rates and the ids it needs.

    Attributes:
        mask_id: the "[MASK]" piece.
        special_ids: ids never chosen (pad, bos, eos, unk, [CLS], [SEP], [MASK]).
        ordinary_ids: (N,) the ids a random replacement is drawn from.
        pad_id: the label of positions not chosen.
        select: share of the non-special positions of a sequence that are chosen.
        to_mask: share of the chosen that become [MASK].
        to_random: share of the chosen that become a random ordinary piece (the rest
            stay as they are).
    """

    mask_id: int
    special_ids: tuple[int, ...]
    ordinary_ids: np.ndarray
    pad_id: int
    select: float = 0.15
    to_mask: float = 0.8
    to_random: float = 0.1

    def __post_init__(self) -> None:
        check_rates(self.select, self.to_mask, self.to_random)

    @classmethod
    def for_vocabulary(
        cls,
        vocab_size: int,
        special_ids: Sequence[int],
        mask_id: int,
        pad_id: int,
        **rates: float,
    ) -> Masking:
        """The masking of a vocabulary whose special ids are `special_ids`; `rates`:
        select, to_mask, to_random (BERT's 0.15, 0.8, 0.1 by default)."""
        special = tuple(sorted(set(special_ids) | {mask_id, pad_id}))
        ordinary = np.setdiff1d(np.arange(vocab_size), np.asarray(special))
        return cls(mask_id, special, ordinary, pad_id, **rates)


def mask_tokens(
    ids: np.ndarray, masking: Masking, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masking of a batch of sequences.

    Args:
        ids: (B, T) token ids.
        masking: the rates and ids.
        rng: where every draw comes from.

    Returns:
        (inputs, labels): the ids with the chosen positions replaced, and the original
        id at each chosen position (`masking.pad_id` elsewhere), both (B, T).
    """
    eligible = ~np.isin(ids, masking.special_ids)  # (B, T)
    n_chosen = np.maximum(1, np.rint(eligible.sum(1) * masking.select)).astype(int)  # (B,)
    n_chosen = np.minimum(n_chosen, eligible.sum(1))
    # k uniformly chosen eligible positions per row: the k smallest random keys
    keys = np.where(eligible, rng.random(ids.shape), np.inf)
    rank = keys.argsort(1).argsort(1)  # (B, T): each position's place in its row's order
    chosen = (rank < n_chosen[:, None]) & eligible
    kind = rng.random(ids.shape)
    to_mask = chosen & (kind < masking.to_mask)
    to_random = chosen & (kind >= masking.to_mask) & (kind < masking.to_mask + masking.to_random)
    inputs = ids.copy()
    inputs[to_mask] = masking.mask_id
    inputs[to_random] = rng.choice(masking.ordinary_ids, size=int(to_random.sum()))
    labels = np.where(chosen, ids, masking.pad_id)
    return inputs, labels


@register_task
class MaskedLanguageModelTask:
    """An encoder-only model learns to restore masked tokens (see `aiayn.training.tasks.base.Task`).

    Args:
        cfg: the model's config: `max_len` is the sequence length, framing included.
        framed: put each block between [CLS] and [SEP], as BERT does.
        select, to_mask, to_random: the masking rates (`Masking`; BERT's by default),
            the task's options (a recipe's `data.task_options`).

    Raises:
        ValueError: a rate outside [0, 1], or to_mask + to_random above 1.
    """

    name: ClassVar[str] = "mlm"
    options: ClassVar[tuple[str, ...]] = ("select", "to_mask", "to_random")

    def __init__(
        self,
        cfg: ModelConfig,
        framed: bool = True,
        select: float = 0.15,
        to_mask: float = 0.8,
        to_random: float = 0.1,
    ) -> None:
        self.cfg, self.framed = cfg, framed
        self.rates = {"select": select, "to_mask": to_mask, "to_random": to_random}
        check_rates(select, to_mask, to_random)
        self.masking: Masking | None = None
        self.frame: tuple[int, int] | None = None
        self.valid: Batches | None = None

    def build_data(
        self, corpus: PreparedCorpus, tokenizer: Tokenizer, config: TrainConfig, env: DistEnv
    ) -> TaskData:
        """Packed blocks (max_len less the frame), masked as each batch is made."""
        symbols = symbol_ids(tokenizer)
        specials = (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, *symbols.values())
        unk = getattr(tokenizer, "unk_id", None)
        self.masking = Masking.for_vocabulary(
            tokenizer.vocab_size,
            specials + ((unk,) if unk is not None else ()),
            symbols[MASK],
            tokenizer.pad_id,
            **self.rates,
        )
        self.frame = (symbols[CLS], symbols[SEP])
        length = self.cfg.max_len - (2 if self.framed else 0)
        data = packed_batches(corpus, tokenizer, config, env, length, 0, self.make_batch, self.name)
        self.valid = data.valid
        return data

    def make_batch(self, blocks: Sequence[Sequence[int]], rng: np.random.Generator) -> TokenBatch:
        """Frame (if asked) and mask `blocks` with draws from `rng`."""
        if self.masking is None or self.frame is None:
            raise RuntimeError("MaskedLanguageModelTask.build_data must run before make_batch")
        ids = padded(blocks, self.cfg.pad_id).numpy()  # (B, T)
        if self.framed:
            cls_id, sep_id = self.frame
            column = np.ones((ids.shape[0], 1), dtype=ids.dtype)
            ids = np.concatenate([column * cls_id, ids, column * sep_id], axis=1)
        inputs, labels = mask_tokens(ids, self.masking, rng)
        n_targets = int((labels != self.cfg.pad_id).sum())
        return TokenBatch(torch.from_numpy(inputs), torch.from_numpy(labels), n_targets)

    def loss(self, network: nn.Module, batch: TokenBatch, label_smoothing: float) -> LossOutput:
        """The loss on the chosen positions only (the others carry the pad label)."""
        return token_loss(network, batch, self.cfg.pad_id, label_smoothing)

    def target_tokens(self, batch: TokenBatch) -> int:
        """The chosen positions."""
        return batch.n_targets

    def validation_metrics(self, model: nn.Module, autocast: Autocast) -> dict[str, float]:
        """{"masked_accuracy": share of chosen valid positions whose argmax is the original}."""
        if self.valid is None:
            return {}
        device = next(model.parameters()).device
        correct = total = 0
        for batch in self.valid.epoch(0):
            batch = batch.to(device)
            with autocast():
                logits = model(batch.inputs)  # (B, T, V)
            chosen = batch.labels != self.cfg.pad_id
            correct += int((logits.argmax(-1) == batch.labels)[chosen].sum())
            total += int(chosen.sum())
        return {"masked_accuracy": correct / total}
