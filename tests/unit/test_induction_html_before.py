"""The explorer's induction page with an earlier checkpoint's scores beside the scores."""

from __future__ import annotations

import math
import re

import pytest
import torch

from aiayn.analysis.induction import InductionScores
from aiayn.apps.explorer.induction import induction_html


def scores(induction: list[list[float]]) -> InductionScores:
    grid = torch.tensor(induction)
    return InductionScores(grid, grid / 2, -grid)


def values(page: str, table_id: str) -> list[float]:
    found = re.search(rf'<table id="{table_id}">(.*?)</table>', page, re.S)
    assert found, f"no table {table_id}"
    return [float(v) for v in re.findall(r'data-value="([^"]*)"', found.group(1))]


def test_before_and_after_tables_hold_each_checkpoint_s_scores_and_the_change():
    before = scores([[0.01, 0.02], [0.03, 0.04]])
    after = scores([[0.01, 0.9], [0.7, 0.04]])
    page = induction_html(after, before, before_label="update 100", after_label="update 900")
    assert values(page, "induction-before") == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert values(page, "induction") == pytest.approx([0.01, 0.9, 0.7, 0.04])
    assert values(page, "copying-before") == pytest.approx([-0.01, -0.02, -0.03, -0.04])
    assert "<small>+0.880</small>" in page  # head 1 of layer 0: 0.02 -> 0.9
    assert "<small>+0.440</small>" in page  # its previous-token score: 0.01 -> 0.45
    assert "update 100" in page and "update 900" in page


def test_without_before_the_page_has_one_table_per_score_and_no_changes():
    page = induction_html(scores([[0.5, math.nan]]), run="runs/x")
    assert "induction-before" not in page and "<small>" not in page
    assert values(page, "induction") == [0.5]
    assert "–" in page  # the missing head


def test_before_of_another_shape_is_refused():
    with pytest.raises(ValueError, match="same model"):
        induction_html(scores([[0.5, 0.5]]), scores([[0.5], [0.5]]))
