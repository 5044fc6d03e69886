"""The ListOps generator (LRA's rules) against an independent evaluator written here: a
stack machine over the token string, numpy's median; the rules checked on the string."""

from __future__ import annotations

import random

import numpy as np
import pytest
from typer.testing import CliRunner

from aiayn.cli import app
from aiayn.data.classification import class_piece, read_classes
from aiayn.data.corpus import PreparedCorpus
from aiayn.data.listops import ListOpsConfig, draw_examples, write_listops


def stack_evaluate(text: str) -> tuple[int, int, list[int]]:
    """The value of a prefix expression read token by token with a stack; also its
    depth (deepest nesting of operators) and each operator's argument count."""
    functions = {
        "MAX": max,
        "MIN": min,
        "MED": lambda xs: int(np.median(xs)),
        "SM": lambda xs: sum(xs) % 10,
    }
    stack: list[tuple[str, list[int]]] = []
    depth, counts, result = 0, [], None
    for token in text.split():
        if token.startswith("["):
            stack.append((token[1:], []))
            depth = max(depth, len(stack))
        elif token == "]":
            name, args = stack.pop()
            counts.append(len(args))
            value = functions[name](args)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        else:
            stack[-1][1].append(int(token))
    assert not stack and result is not None
    return result, depth, counts


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]", 5),
        ("[MED 1 2 ]", 1),  # even count: the mean of the middle two, rounded down
        ("[MED 9 0 4 7 ]", 5),
        ("[SM 9 8 [MAX 1 7 ] ]", 4),
        ("[MIN [SM 5 5 ] 3 ]", 0),
    ],
)
def test_the_independent_evaluator_by_hand(text, value):
    assert stack_evaluate(text)[0] == value


def test_generated_examples_follow_lras_rules_and_carry_their_value():
    cfg = ListOpsConfig()
    examples = draw_examples(random.Random(3), cfg, 60)
    assert len({text for text, _ in examples}) == 60
    for text, label in examples:
        value, depth, counts = stack_evaluate(text)
        assert label == value
        assert 500 <= len(text.split()) <= 2000
        assert depth <= 10
        assert all(2 <= n <= 10 for n in counts)
        assert set(text.split()) <= {"[MAX", "[MIN", "[MED", "[SM", "]"} | set("0123456789")
    assert len({label for _, label in examples}) >= 6  # not one class


def splits_of(directory):
    corpus = PreparedCorpus.load(directory)
    return {name: corpus.read(name) for name in ("train", "valid", "test")}


def test_the_data_set_is_written_once_from_its_seed(tmp_path):
    cfg = ListOpsConfig(scale=0.0005, seed=7)  # 48 / 1 / 1 examples
    first = write_listops(tmp_path / "a", cfg)
    splits = splits_of(first)
    assert {name: len(rows) for name, rows in splits.items()} == cfg.split_sizes()
    assert cfg.split_sizes() == {"train": 48, "valid": 1, "test": 1}
    texts = [text for rows in splits.values() for text, _ in rows]
    assert len(set(texts)) == len(texts)  # no expression in two splits
    for text, label in splits["train"]:
        assert str(stack_evaluate(text)[0]) == label
    names = sorted(path.name for path in first.iterdir())
    assert "listops.json" in names and "spm.model" in names
    again = write_listops(tmp_path / "b", cfg)
    for name in names:
        assert (again / name).read_bytes() == (first / name).read_bytes(), name
    other = write_listops(tmp_path / "c", ListOpsConfig(scale=0.0005, seed=8))
    assert (other / "train.text").read_bytes() != (first / "train.text").read_bytes()

    stamp = (first / "train.text").stat().st_mtime_ns
    (first / "mine").write_text("kept")  # the directory is reused, not rewritten
    write_listops(first, cfg)
    assert (first / "mine").exists() and (first / "train.text").stat().st_mtime_ns == stamp


def test_the_tokenizer_gives_one_id_per_token_and_one_piece_per_class(tmp_path):
    corpus = PreparedCorpus.load(write_listops(tmp_path, ListOpsConfig(scale=0.0005)))
    tokenizer = corpus.tokenizer()
    assert read_classes(corpus) == list("0123456789")
    text = corpus.read("train")[0][0]
    assert tokenizer.pieces(text) == ["\u2581" + word for word in text.split()]
    assert len(tokenizer.encode("[MAX 0 [MED 7 8 ] ]")) == 7
    pieces = {tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)}
    assert {class_piece(i) for i in range(10)} <= pieces
    assert tokenizer.vocab_size == 4 + 15 + 10  # specials, words, classes: nothing else


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"scale": 0}, "scale"),
        ({"scale": 2}, "scale"),
        ({"max_depth": 1}, "max_depth"),
        ({"max_args": 1}, "max_args"),
        ({"min_length": 10, "max_length": 5}, "max_length"),
        ({"branch_probability": 1.0}, "branch_probability"),
    ],
)
def test_bad_settings_are_refused_by_name(settings, named):
    with pytest.raises(ValueError, match=f"ListOpsConfig.{named} must be"):
        ListOpsConfig(**settings)


def test_the_command_writes_the_data_set_and_refuses_a_bad_scale_in_one_line(tmp_path):
    runner = CliRunner()
    out = tmp_path / "listops"
    done = runner.invoke(app, ["prepare", "listops", "--out", str(out), "--scale", "0.0005"])
    assert done.exit_code == 0, done.output
    assert "train 48, valid 1, test 1" in done.output
    assert len(PreparedCorpus.load(out).read("train")) == 48
    bad = runner.invoke(app, ["prepare", "listops", "--out", str(tmp_path / "x"), "--scale", "2"])
    assert bad.exit_code == 1 and "Traceback" not in bad.output
    assert bad.output.strip().splitlines() == [
        "aiayn: error: ListOpsConfig.scale must be in (0, 1], got 2.0"
    ]
    assert not (tmp_path / "x").exists()
