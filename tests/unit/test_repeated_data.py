"""Repeated random symbols (aiayn.data.repeated): the lines, the corpus, one id per symbol."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from aiayn.cli import app
from aiayn.data.lm import read_documents
from aiayn.data.repeated import (
    ALPHABET,
    RepeatedConfig,
    draw_lines,
    line_start_id,
    prepare_lm_repeated,
    symbol_ids,
)

SMALL = RepeatedConfig(n_symbols=10, min_length=3, max_length=7, lines=(300, 20, 20), seed=4)


def test_each_line_is_a_random_half_then_the_same_half():
    splits = draw_lines(SMALL)
    assert [len(splits[name]) for name in ("train", "valid", "test")] == [300, 20, 20]
    lengths = set()
    for line in [line for lines in splits.values() for line in lines]:
        half = len(line) // 2
        assert len(line) == 2 * half and line[:half] == line[half:]
        assert set(line) <= set(ALPHABET[:10])
        lengths.add(half)
    assert lengths == set(range(3, 8))  # every T in [min_length, max_length] drawn
    assert draw_lines(SMALL) == splits  # the seed fixes them
    assert draw_lines(RepeatedConfig(**{**SMALL.__dict__, "seed": 5})) != splits


def test_the_corpus_gives_one_id_per_symbol(tmp_path):
    corpus = prepare_lm_repeated(tmp_path / "rnd", SMALL)
    tokenizer = corpus.tokenizer()
    ids = symbol_ids(tokenizer)
    assert sorted(tokenizer.id_to_piece(i) for i in ids) == sorted(ALPHABET[:10])
    line = read_documents(corpus, "train")[0]
    encoded = tokenizer.encode(line)
    # sentencepiece's word marker, then one id per symbol
    assert tokenizer.id_to_piece(encoded[0]) == "\u2581"
    assert encoded[0] == line_start_id(tokenizer) and encoded[0] not in ids
    assert [tokenizer.id_to_piece(i) for i in encoded[1:]] == list(line)
    assert corpus.stats["source"]["n_symbols"] == 10


@pytest.mark.parametrize(
    "overrides, field",
    [({"n_symbols": 1}, "n_symbols"), ({"n_symbols": 63}, "n_symbols"),
     ({"min_length": 5, "max_length": 4}, "min_length"), ({"lines": (0, 1, 1)}, "lines")],
)  # fmt: skip
def test_settings_out_of_range_are_refused_by_name(overrides, field):
    with pytest.raises(ValueError, match=field):
        RepeatedConfig(**overrides)


def test_prepare_lm_repeated_from_the_command_line(tmp_path):
    out = tmp_path / "rnd"
    args = ["prepare", "lm", "repeated", str(out), "--symbols", "6", "--lines", "50"]
    result = CliRunner().invoke(app, [*args, "--min-length", "2", "--max-length", "4"])
    assert result.exit_code == 0, result.output
    assert "train:        50 documents" in result.output
    assert (out / "train.rnd").is_file()
    bad = CliRunner().invoke(
        app, ["prepare", "lm", "repeated", str(tmp_path / "x"), "--symbols", "99"]
    )
    assert bad.exit_code == 1
    assert "n_symbols must lie in [2, 62]" in bad.output


def test_lines_of_a_fixed_length_hold_the_pair_inside_random_filler():
    cfg = RepeatedConfig(n_symbols=10, min_length=3, max_length=9, lines=(200, 1, 1), seed=1,
                         line_length=14)  # fmt: skip
    lengths = set()
    for line in draw_lines(cfg)["train"]:
        assert len(line) == 14
        # some T in [3, 7] (7 = 14 // 2) and some offset make line[o:o+T] == line[o+T:o+2T]
        found = {t for t in range(3, 8) for o in range(15 - 2 * t)
                 if line[o : o + t] == line[o + t : o + 2 * t]}  # fmt: skip
        assert found
        lengths.add(max(found))
    assert max(lengths) == 7 and min(lengths) <= 4  # T is drawn, capped at line_length // 2
    with pytest.raises(ValueError, match="line_length"):
        RepeatedConfig(min_length=8, line_length=15)


def test_repeat_to_fill_repeats_the_half_to_the_line_length_with_no_filler():
    cfg = RepeatedConfig(n_symbols=10, min_length=3, max_length=9, lines=(200, 1, 1), seed=1,
                         line_length=14, repeat_to_fill=True)  # fmt: skip
    periods = set()
    for line in draw_lines(cfg)["train"]:
        assert len(line) == 14
        # the smallest T in [3, 7] with line[i] == line[i - T] everywhere: the drawn half
        period = next(t for t in range(3, 8) if all(line[i] == line[i - t] for i in range(t, 14)))
        periods.add(period)
    assert max(periods) == 7 and min(periods) == 3
    with pytest.raises(ValueError, match="repeat_to_fill"):
        RepeatedConfig(repeat_to_fill=True)
