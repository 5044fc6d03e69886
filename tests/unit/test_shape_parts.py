"""`models` names nothing above it: the inference and apps layers add a shape's frozen
form, user and verb from their own modules, so every link is an import the layer check
(import-linter, tests/unit/test_layers.py) sees."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from torch import nn

import aiayn.apps
from aiayn.apps.fill import MaskFiller
from aiayn.apps.generate import Generator
from aiayn.apps.translate import Translator
from aiayn.inference.frozen import FrozenDecoderOnly, FrozenTransformer
from aiayn.models import SHAPES, add_to_shape, register_shape, shape_spec

MODELS = Path(__file__).parents[2] / "src" / "aiayn" / "models"
ABOVE = re.compile(r"\baiayn\.(inference|io|training|analysis|apps|cli)\b")


def names_in_code(path: Path) -> list[str]:
    """The imports and the string constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append(node.module or "")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            found.append(node.value)
    return found


def test_no_module_of_models_names_a_layer_above_it_or_imports_by_string():
    for path in sorted(MODELS.glob("*.py")):
        names = names_in_code(path)
        assert not [n for n in names if ABOVE.search(n)], path.name
        assert "importlib" not in names, path.name


def test_the_checker_finds_an_upward_string(tmp_path):
    module = tmp_path / "shape.py"
    module.write_text('"""Docs may say aiayn.apps."""\nFROZEN = "aiayn.inference.frozen:X"\n')
    assert [n for n in names_in_code(module) if ABOVE.search(n)] == ["aiayn.inference.frozen:X"]


@pytest.mark.parametrize(
    ("shape", "frozen", "user", "verb"),
    [
        ("encoder_decoder", FrozenTransformer, Translator, "translate"),
        ("decoder_only", FrozenDecoderOnly, Generator, "generate"),
        ("encoder_only", None, MaskFiller, "fill"),
    ],
)
def test_the_layers_above_add_their_parts_to_the_shapes(shape, frozen, user, verb):
    spec = shape_spec(shape)
    assert (spec.frozen, spec.user, spec.verb) == (frozen, user, verb)
    assert spec.user_name == f"aiayn {verb} ({user.__name__})"
    assert aiayn.apps.verb_of(shape) == verb


def test_a_part_named_by_a_string_is_refused():
    @register_shape("test_strings", task="lm")
    class Strings(nn.Module):
        def __init__(self, cfg) -> None:
            super().__init__()

    try:
        with pytest.raises(TypeError, match="give its frozen as the object"):
            add_to_shape("test_strings", frozen="aiayn.inference.frozen:FrozenTransformer")
        with pytest.raises(TypeError, match="no part 'cli'"):
            add_to_shape("test_strings", cli="x")
        add_to_shape("test_strings", user=Generator, verb="generate")
        assert shape_spec("test_strings").user_name == "aiayn generate (Generator)"
        assert shape_spec("test_strings").frozen is None
    finally:
        SHAPES.unregister("test_strings")


def test_every_shape_takes_its_pieces_from_the_stacks_not_from_the_papers_model():
    from aiayn.models import encoder_decoder, stacks

    for path in sorted(MODELS.glob("*.py")):
        if path.name != "encoder_decoder.py":
            assert "aiayn.models.encoder_decoder" not in names_in_code(path), path.name
    for name in ("Embedding", "Encoder", "Decoder", "PreSoftmaxProjection", "EncoderOutput"):
        assert getattr(encoder_decoder, name) is getattr(stacks, name)  # the old path works
        assert getattr(stacks, name).__module__ == "aiayn.models.stacks"
