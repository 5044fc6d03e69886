"""`aiayn induction --html`: the three score grids of a GPT run as one offline page, each
cell the library's score on the run's own weights; a bad --html refused in one line."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from test_induction_cli import assert_refused, invoke, runs  # noqa: F401 (a fixture)

SCORES = ("induction", "previous_token", "copying")


def _table(page: str, name: str) -> list[list[float]]:
    """The numbers of one table, layer by layer: a cell's data-value, NaN for a dash."""
    found = re.search(rf'<table id="{name}">(.*?)</table>', page, re.S)
    assert found, f"no {name} table"
    rows = re.findall(r"<tr><th>layer \d+</th>(.*?)</tr>", found.group(1), re.S)
    return [
        [
            float(v) if v else math.nan
            for v in re.findall(r'<td[^>]*?(?:data-value="([^"]*)")?>', row)
        ]
        for row in rows
    ]


def test_html_holds_the_json_scores(runs, tmp_path: Path) -> None:  # noqa: F811
    out, page = tmp_path / "out", tmp_path / "induction.html"
    result = invoke("induction", runs["gpt"], "--length", 5, "--batch", 2, "--out", out,
                    "--html", page)  # fmt: skip
    assert result.exit_code == 0, result.output
    text = page.read_text(encoding="utf-8")
    data = json.loads((out / "induction.json").read_text())
    for name in SCORES:
        expected = [[math.nan if v is None else v for v in row] for row in data[name]]
        shown = _table(text, name)
        assert len(shown) == len(expected) == 2 and len(shown[0]) == 4
        for got, want in zip(shown, expected, strict=True):
            assert got == pytest.approx(want, nan_ok=True)
    assert str(runs["gpt"]) in text
    assert not re.search(r'\b(src|href)\s*=\s*"', text), "the page must load nothing"


def test_unwritable_html_is_refused_in_one_line(runs, tmp_path: Path) -> None:  # noqa: F811
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = tmp_path / "out"
    result = invoke("induction", runs["gpt"], "--out", out, "--html", blocker / "page.html")
    assert_refused(result, str(blocker), out)
