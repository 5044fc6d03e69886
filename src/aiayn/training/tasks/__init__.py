"""Tasks: what a model learns, as the trainer sees it (the protocol is in `tasks.base`).

A recipe names its task (`data.task`; by default its model shape's, `ShapeSpec.task`);
`build_task` makes it for the model's config. A new kind of training is a module in
this package (or a package's `aiayn.tasks` entry point) with a class that has the four
methods of `Task`, decorated `@register_task`; no list names it:

    translation      the paper's: source -> target with an encoder-decoder
    lm               next-token language modelling (decoder-only, GPT)
    mlm              masked language modelling (encoder-only, BERT)
    lm_translation   translation as a language model over "source <sep> target"
    classify         sequence classification (an encoder with a mean-pooled head)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiayn.config import ModelConfig
from aiayn.training.tasks.base import (
    TASKS,
    Batches,
    Task,
    TaskBatch,
    TaskData,
    evaluate_task,
    register_task,
)
from aiayn.training.tasks.lm import LanguageModelTask
from aiayn.training.tasks.lm_translation import DecoderOnlyTranslationTask
from aiayn.training.tasks.mlm import MaskedLanguageModelTask
from aiayn.training.tasks.translation import BleuSet, TranslationTask

__all__ = [
    "DEFAULT_TASK", "TASKS", "Batches", "BleuSet", "DecoderOnlyTranslationTask",
    "LanguageModelTask", "MaskedLanguageModelTask", "Task", "TaskBatch", "TaskData",
    "TranslationTask", "build_task", "evaluate_task", "register_task",
]  # fmt: skip

DEFAULT_TASK = TranslationTask.name


def build_task(name: str, cfg: ModelConfig, options: Mapping[str, Any] | None = None) -> Task:
    """The task registered as `name`, for a model of config `cfg`, with its own `options`
    (a recipe's `data.task_options`) as keyword arguments.

    Raises:
        ValueError: no task of that name (the message lists the known ones), an option
            the task does not declare, or a value it refuses.
    """
    return TASKS.get(name)(cfg, **TASKS.options(name, options))
