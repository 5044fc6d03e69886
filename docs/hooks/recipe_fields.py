"""A MkDocs hook: the recipe fields' tables, generated from the config dataclasses.

`docs/reference/recipe.md` holds the marker `<!-- recipe-fields -->`; at build time it
is replaced by one table per recipe section (`data`, `model`, `train`): each field's
name, type, default and the description its dataclass's docstring gives. Nothing is
written by hand, so a field added to `ModelConfig` or `TrainConfig` appears on the
next build (tests/docs/test_docs_site.py checks that every field does).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import typing

import griffe

MARKER = "<!-- recipe-fields -->"


def _described(cls: type) -> dict[str, str]:
    """Field name -> its description, from a Google-style docstring's Args/Attributes."""
    docstring = griffe.Docstring(inspect.getdoc(cls) or "")
    found: dict[str, str] = {}
    for section in docstring.parse("google", warn_missing_types=False):
        if section.kind.value in ("parameters", "attributes"):
            for item in section.value:
                for name in item.name.split(","):  # "betas, eps: Adam's ..."
                    found[name.strip()] = " ".join(item.description.split())
    return found


def _type_name(annotation: object) -> str:
    """A type as the source writes it (`int | None`, `Activation`, `Path`)."""
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    return text.replace("typing.", "").replace("pathlib.", "").replace("NoneType", "None")


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    if isinstance(value, enum.Enum):
        value = value.value
    return "null" if value is None else f"`{value!r}`".replace("'", "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def field_rows(cls: type) -> list[tuple[str, str, str, str]]:
    """(name, type, default, description) for each field of a config dataclass."""
    described = _described(cls)
    hints = typing.get_type_hints(cls)
    return [
        (
            field.name,
            _type_name(hints.get(field.name, field.type)),
            _default(field),
            described.get(field.name, ""),
        )
        for field in dataclasses.fields(cls)
    ]


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    lines = ["| field | type | default | what it sets |", "|---|---|---|---|"]
    lines += [
        f"| `{name}` | `{kind}` | {_cell(default)} | {_cell(text)} |"  # `|` in code is kept
        for name, kind, default, text in rows
    ]
    return "\n".join(lines)


def recipe_fields_markdown() -> str:
    """The three tables (data, model, train) as Markdown."""
    from aiayn.config import ModelConfig, TrainConfig
    from aiayn.training.recipe import DATA_KEYS, Recipe

    recipe, kinds = _described(Recipe), typing.get_type_hints(Recipe)
    data_rows = [
        (name, _type_name(kinds[name]), _default(Recipe.__dataclass_fields__[name]),
         recipe.get(name, ""))
        for name in DATA_KEYS
    ]  # fmt: skip
    preset = (
        "preset",
        "str",
        "null",
        f"a preset to start from: {recipe_presets()}; the fields below override it",
    )
    model_rows = [preset, *field_rows(ModelConfig)]
    return "\n\n".join(
        [
            "## `data`",
            _table(data_rows),
            "## `model`",
            "Any field of `aiayn.config.ModelConfig`. `vocab_size` and the special ids "
            "(`pad_id`, `bos_id`, `eos_id`) come from the corpus's subword model when absent.",
            _table(model_rows),
            "## `train`",
            "The fields of `aiayn.config.TrainConfig` (section 5 of the paper, plus the "
            "run's limits and cadence).",
            _table(field_rows(TrainConfig)),
        ]
    )


def recipe_presets() -> str:
    """The ModelConfig presets a recipe's `model.preset` may name."""
    from aiayn.config import ModelConfig

    names = [
        name
        for name, member in vars(ModelConfig).items()
        if isinstance(member, classmethod) and name not in ("from_dict",)
    ]
    return ", ".join(f"`{name}`" for name in names)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """MkDocs hook: fill the recipe page's marker."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, recipe_fields_markdown())
