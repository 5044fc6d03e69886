"""Training recipes: the YAML that names a corpus, a task, a model and its training.

    data:                     # where the examples come from and what is learned
      corpus: DIR             #   a directory from `aiayn prepare`
      task: translation       #   a name in `aiayn.training.tasks.TASKS` (default: the shape's task)
      task_options: {}        #   the task's own settings (mlm: select, to_mask, to_random;
                              #   lm: in_context_early, in_context_late)
    model: {preset: base, ...}   # `ModelConfig` fields (preset: tiny | base | big | gpt | bert)
    train: {max_steps: ..., ...} # `TrainConfig` fields

A run directory keeps the resolved recipe as RUN/config.yaml (every model and train
field; the corpus absolute). Resuming compares the new recipe with it: only the
limits (`RESUMABLE_KEYS`) may change.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aiayn.config import ModelConfig, TrainConfig, config_fields, plain
from aiayn.models import SHAPES
from aiayn.training.tasks import DEFAULT_TASK, TASKS

CONFIG_FILE = "config.yaml"
PRESETS = ("tiny", "base", "big", "gpt", "bert")
DATA_KEYS = ("corpus", "task", "task_options")
RESUMABLE_KEYS = ("train.max_steps", "train.max_epochs", "train.max_minutes")
# Keys added after runs were made: a run's config.yaml without one holds this value.
ADDED_KEYS = {"data.task": DEFAULT_TASK, "data.task_options": {}}


@dataclass(frozen=True)
class Recipe:
    """A training recipe: the corpus, the task, the model and the training settings.

    Attributes:
        corpus: a directory prepared by `aiayn prepare` (absolute).
        model: `preset` (tiny | base | big | gpt | bert, optional) and any `ModelConfig` fields;
            vocab_size and the special ids come from the corpus's subword model
            when absent.
        train: the training settings.
        task: what the model learns, a name in `aiayn.training.tasks.TASKS`.
        task_options: the task's own settings, by the names it declares (`options`).
    """

    corpus: Path
    model: dict[str, Any] = field(default_factory=dict)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(max_epochs=1))
    task: str = DEFAULT_TASK
    task_options: dict[str, Any] = field(default_factory=dict)

    def model_config(self, vocab_size: int, pad_id: int, bos_id: int, eos_id: int) -> ModelConfig:
        """The `ModelConfig` for a tokenizer with these sizes and ids.

        Raises:
            ValueError: a field is out of range, or a special id disagrees with the
                tokenizer's.
        """
        fields = dict(self.model)
        preset = fields.pop("preset", None)
        tokenizer = {"vocab_size": vocab_size, "pad_id": pad_id, "bos_id": bos_id, "eos_id": eos_id}
        for name, value in tokenizer.items():
            if fields.setdefault(name, value) != value:
                raise ValueError(
                    f"model.{name} is {fields[name]} but the corpus's subword model has {value}"
                )
        if preset is None:
            return ModelConfig.from_dict(fields)
        unknown = sorted(set(fields) - config_fields(ModelConfig))
        if unknown:
            raise ValueError(f"unknown model key(s): {', '.join(unknown)}")
        return getattr(ModelConfig, preset)(**fields)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as YAML-ready plain types."""
        return {
            "data": {
                "corpus": str(self.corpus),
                "task": self.task,
                "task_options": dict(self.task_options),
            },
            "model": dict(self.model),
            "train": self.train.to_dict(),
        }

    def resolved(self, cfg: ModelConfig) -> dict[str, dict[str, Any]]:
        """What RUN/config.yaml holds: this recipe with every field of `cfg` spelled out."""
        return {**self.to_dict(), "model": cfg.to_dict()}


def _check_keys(section: str, keys: Sequence[str], where: str) -> None:
    allowed = {
        "data": set(DATA_KEYS),
        "model": config_fields(ModelConfig) | {"preset"},
        "train": config_fields(TrainConfig),
    }[section]
    unknown = [f"{section}.{k}" for k in keys if k not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")


def recipe_from_dict(
    values: dict[str, Any],
    overrides: Sequence[str] = (),
    base_dir: Path | None = None,
    where: str = "recipe",
) -> Recipe:
    """Build a `Recipe` from its YAML form plus `key=value` overrides.

    Args:
        values: {"data": {"corpus": DIR, "task": NAME}, "model": {...}, "train": {...}}.
        overrides: dotted keys with YAML values: "train.lr_scale=2", "model.d_model=256".
        base_dir: the recipe file's directory. A relative corpus path from the file is
            looked for there first, then in the current directory; one from an
            override is relative to the current directory.
        where: names the source in error messages.

    Raises:
        ValueError: unknown sections or keys (named), malformed overrides, bad values.
    """
    sections = _sections(values, where)
    corpus_from_file = "corpus" in sections["data"]
    for item in overrides:
        key, equals, text = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not equals or not dot or section not in sections or not name:
            raise ValueError(
                f"override {item!r}: expected SECTION.KEY=VALUE with SECTION data, model or train"
            )
        _check_keys(section, [name], "override")
        try:
            sections[section][name] = yaml.load(text, Loader=_UniqueKeyLoader)
        except yaml.YAMLError as err:
            raise ValueError(f"override {item!r}: not a YAML value: {err}") from None
        if key.strip() == "data.corpus":
            corpus_from_file = False
    data = sections["data"]
    if "corpus" not in data:
        raise ValueError(f"{where}: data.corpus is missing (a directory from `aiayn prepare`)")
    corpus = Path(str(data["corpus"])).expanduser()
    if not corpus.is_absolute():
        candidates = [base_dir / corpus] if corpus_from_file and base_dir is not None else []
        candidates.append(Path.cwd() / corpus)
        corpus = next((c for c in candidates if c.exists()), candidates[-1])
    preset = sections["model"].get("preset")
    if preset is not None and preset not in PRESETS:
        raise ValueError(
            f"{where}: model.preset must be one of {', '.join(PRESETS)}, got {preset!r}"
        )
    task = data.get("task") or _default_task(sections["model"])
    if task not in TASKS:
        raise ValueError(
            f"{where}: data.task must be one of {', '.join(TASKS.names())}, got {task!r}"
        )
    task_options = data.get("task_options") or {}
    if not isinstance(task_options, dict) or not all(isinstance(k, str) for k in task_options):
        raise ValueError(
            f"{where}: data.task_options must map option names to values, got {task_options!r}"
        )
    try:
        TASKS.options(task, task_options)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    try:
        train = TrainConfig(**sections["train"])
    except TypeError as err:
        raise ValueError(f"{where}: train: {err}") from None
    return Recipe(
        corpus=corpus.resolve(),
        model=sections["model"],
        train=train,
        task=task,
        task_options=dict(task_options),
    )


def _sections(values: Any, where: str) -> dict[str, dict[str, Any]]:
    """The data, model and train sections of a recipe's YAML, their keys checked."""
    if not isinstance(values, dict):
        raise ValueError(f"{where}: expected a mapping with data, model and train sections")
    unknown = sorted(set(values) - {"data", "model", "train"})
    if unknown:
        raise ValueError(
            f"{where}: unknown section(s) {', '.join(unknown)} (expected data, model, train)"
        )
    sections: dict[str, dict[str, Any]] = {}
    for name in ("data", "model", "train"):
        section = values.get(name) or {}
        if not isinstance(section, dict):
            raise ValueError(f"{where}: section {name} must be a mapping")
        _check_keys(name, list(section), where)
        sections[name] = dict(section)
    return sections


class DuplicateKeyError(ValueError):
    """A YAML mapping that gives one key twice (PyYAML would keep the last silently)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping, and reading
    `1e-6` as a number (YAML 1.2), where PyYAML's YAML 1.1 rules ask for a dot (`1.0e-6`)
    and would give the string "1e-6"."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(
                    f"{line}: key {key!r} is given twice (first on line {seen[key]}); keep one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read a YAML recipe and apply `key=value` overrides (see `recipe_from_dict`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: invalid UTF-8 or YAML, a key given twice, unknown keys (named) or
            bad values; each names the file (and the line where known).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ValueError(
            f"{path}:{line}: invalid UTF-8 ({err.reason}); a recipe must be UTF-8 text"
        ) from None
    try:
        values = yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from None
    except DuplicateKeyError as err:
        raise ValueError(f"{path}:{err}") from None
    return recipe_from_dict(values, overrides, base_dir=path.parent.resolve(), where=str(path))


def _flatten(resolved: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {f"{s}.{k}": v for s, section in resolved.items() for k, v in section.items()}


def _model_defaults() -> dict[str, Any]:
    """model.FIELD: default, for fields a run written before the field existed lacks."""
    defaults = {}
    for f in dataclasses.fields(ModelConfig):
        if f.default is not dataclasses.MISSING and f.default is not None:
            defaults[f"model.{f.name}"] = plain(f.default)
    return defaults


def check_same_run(run_dir: Path, resolved: dict[str, dict[str, Any]]) -> None:
    """Refuse to resume a run made with another recipe (limits excepted).

    Args:
        run_dir: the run directory; without a config.yaml there is nothing to compare.
        resolved: the new run's `Recipe.resolved`.

    Raises:
        ValueError: keys other than `RESUMABLE_KEYS` differ (named).
    """
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return
    new = _flatten(resolved)
    written = _flatten(yaml.safe_load(path.read_text(encoding="utf-8")) or {})
    added = {k: v for k, v in {**ADDED_KEYS, **_model_defaults()}.items() if k in new}
    old = {**added, **written}  # a key the run predates counts as its default
    differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    differ = [k for k in differ if k not in RESUMABLE_KEYS]
    if differ:
        raise ValueError(
            f"{run_dir} holds a run of another recipe: {', '.join(differ)} differ from its "
            f"{CONFIG_FILE} (only {', '.join(RESUMABLE_KEYS)} may change when resuming); "
            "use another --run directory"
        )


def _default_task(model: dict[str, Any]) -> str:
    """The task of the model section's shape (`ShapeSpec.task`): translation for the
    paper's encoder-decoder, lm for a decoder-only model, mlm for an encoder-only one."""
    architecture = model.get("architecture")
    if architecture is None and model.get("preset") is not None:
        # the preset's own architecture (any vocabulary holds its special ids)
        architecture = getattr(ModelConfig, model["preset"])(vocab_size=1 << 20).architecture
    if architecture is None or architecture not in SHAPES:
        return DEFAULT_TASK
    return SHAPES.get(architecture).task or DEFAULT_TASK
