"""Tasks: what a model learns, as the trainer sees it (the protocol is in `tasks.base`).

A recipe names its task (`data.task`, default "translation"); `build_task` makes it
for the model's config. A new kind of training (language modelling, masked LM) is a
module here with a class that has the four methods of `Task`, plus one line in
`TASKS`.
"""

from __future__ import annotations

from collections.abc import Callable

from aiayn.config import ModelConfig
from aiayn.tasks.base import Batches, Task, TaskBatch, TaskData, evaluate_task
from aiayn.tasks.lm import LanguageModelTask
from aiayn.tasks.lm_translation import DecoderOnlyTranslationTask
from aiayn.tasks.mlm import MaskedLanguageModelTask
from aiayn.tasks.translation import BleuSet, TranslationTask

__all__ = [
    "DEFAULT_TASK", "TASKS", "Batches", "BleuSet", "DecoderOnlyTranslationTask",
    "LanguageModelTask", "MaskedLanguageModelTask", "Task", "TaskBatch", "TaskData",
    "TranslationTask", "build_task", "evaluate_task",
]  # fmt: skip

TASKS: dict[str, Callable[[ModelConfig], Task]] = {
    TranslationTask.name: TranslationTask,
    LanguageModelTask.name: LanguageModelTask,
    MaskedLanguageModelTask.name: MaskedLanguageModelTask,
    DecoderOnlyTranslationTask.name: DecoderOnlyTranslationTask,
}
DEFAULT_TASK = TranslationTask.name


def build_task(name: str, cfg: ModelConfig) -> Task:
    """The task registered as `name`, for a model of config `cfg`.

    Raises:
        ValueError: no task of that name (the message lists the known ones).
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}: expected one of {', '.join(TASKS)}")
    return TASKS[name](cfg)
