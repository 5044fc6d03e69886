"""The task protocol: what the trainer asks of the thing a model learns.

A task owns everything that depends on the shape of the data and of the model:
how a prepared corpus becomes batches, the training forward pass and its loss, the
token count that loss is normalised by, and the metrics beyond loss at validation.
The trainer (loop, precision, DDP, checkpoints, stop rules, metrics) calls only the
methods below, so a new kind of training is a new module in `aiayn.training.tasks` whose
class is decorated `@register_task`; the trainer does not change.

A language-modelling task on a decoder-only model, for example, is in outline
(`aiayn.training.tasks.lm.LanguageModelTask`; `mlm` and `lm_translation` are its siblings):

    @register_task
    class LanguageModelTask:
        name = "lm"
        def build_data(self, corpus, tokenizer, config, env):
            # the corpus's text as one id stream, cut into blocks of max_len + 1 ids,
            # batched by token budget and sharded by env.rank -> TaskData(train, valid)
        def loss(self, network, batch, label_smoothing):
            logits = network(batch.ids[:, :-1])  # (B, T, V)
            return label_smoothed_cross_entropy(
                logits, batch.ids[:, 1:], self.pad_id, label_smoothing
            )
        def target_tokens(self, batch):
            return batch.n_targets  # non-pad next-token targets
        def validation_metrics(self, model, autocast):
            return {}  # perplexity already comes from the validation loss

`aiayn.training.tasks.translation.TranslationTask` is the paper's task.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, TypeVar

import torch
from torch import nn

from aiayn.config.plugins import Registry

if TYPE_CHECKING:
    from aiayn.config import TrainConfig
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.training.distributed import DistEnv
    from aiayn.training.loss import LossOutput


class TaskBatch(Protocol):
    """A batch of a task: whatever its `loss` reads, movable to a device."""

    def to(self, device: torch.device | str) -> TaskBatch:
        """The same batch on `device`."""
        ...


class Batches(Protocol):
    """A task's batches, epoch by epoch (`aiayn.data.batching.TokenBatcher` is one)."""

    def __len__(self) -> int:
        """Batches per epoch on this process (the same on every process)."""
        ...

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[TaskBatch]:
        """This process's batches of `epoch` after the first `skip`, in a fixed order
        given the epoch (so that a resumed run reads what an uninterrupted one would)."""
        ...

    def padding_fraction(self) -> float:
        """Share of one epoch's batch positions that are padding (the trainer logs it)."""
        ...


@dataclass(frozen=True)
class TaskData:
    """What `Task.build_data` gives the trainer.

    Attributes:
        train: this process's training batches (sharded by rank).
        valid: validation batches (unsharded; only rank 0 validates), or None.
    """

    train: Batches
    valid: Batches | None


Autocast = Callable[[], AbstractContextManager]


class Task(Protocol):
    """The forward pass, the loss and the data of one kind of training.

    Attributes:
        name: the task's name in `TASKS` and in recipes (`data.task`).
    """

    name: ClassVar[str]

    def build_data(
        self, corpus: PreparedCorpus, tokenizer: Tokenizer, config: TrainConfig, env: DistEnv
    ) -> TaskData:
        """The training and validation batches of a prepared corpus.

        Args:
            corpus: the corpus from `aiayn prepare`.
            tokenizer: its subword model.
            config: the training settings (`max_tokens`, `seed`, ...).
            env: this process's rank and the number of processes, to shard by.
        """
        ...

    def loss(self, network: nn.Module, batch: TaskBatch, label_smoothing: float) -> LossOutput:
        """The forward pass of `network` on `batch` and its summed loss.

        The trainer calls it inside the autocast context, with `batch` already on the
        network's device, and normalises by the `target_tokens` of the whole update.
        `network` may be wrapped (DDP, `torch.compile`): call it, do not read its
        attributes. Compute the loss in float32 (`label_smoothed_cross_entropy` does).
        At validation `label_smoothing` is 0, and `LossOutput.nll / n_tokens` is the
        reported loss.
        """
        ...

    def target_tokens(self, batch: TaskBatch) -> int:
        """The tokens `loss` sums over: the denominator of the per-token loss."""
        ...

    def validation_metrics(self, model: nn.Module, autocast: Autocast) -> dict[str, float]:
        """Metrics beyond the loss at each validation (e.g. greedy BLEU), or {}.

        Called on rank 0 only, under `torch.no_grad`, with the bare model in eval mode;
        `autocast()` gives the training precision's context for its forward passes.
        """
        ...


TASKS: Registry[Callable[..., Task]] = Registry(
    "training task", "aiayn.training.tasks", "aiayn.tasks", "data.task", "data.task_options"
)
"""The tasks by name (`data.task`); every module of this package is imported on first use."""

TaskT = TypeVar("TaskT")


def register_task(task: TaskT) -> TaskT:
    """A class decorator that registers a task class under its `name` attribute.

    Raises:
        ValueError: the name is empty or taken.
    """
    return TASKS.register(task.name)(task)


@torch.no_grad()
def evaluate_task(
    task: Task, model: nn.Module, batches: Batches, device: torch.device, autocast: Autocast
) -> dict[str, float]:
    """The validation metrics of `model` at `task`: "loss" (cross-entropy per target
    token, without label smoothing), "ppl" (its exponential) and the task's own.

    The model is in eval mode while this runs, and back in train mode after.
    """
    model.eval()
    nll = tokens = 0.0
    for batch in batches.epoch(0):
        with autocast():
            out = task.loss(model, batch.to(device), 0.0)
        nll += out.nll.item()
        tokens += int(out.n_tokens)
    metrics = {"loss": nll / tokens, "ppl": math.exp(min(nll / tokens, 50.0))}
    metrics.update(task.validation_metrics(model, autocast))
    model.train()
    return metrics
