"""The tutorials' diagrams are the ones docs/hooks/diagrams.py draws, readable, and shown.

Each figure is drawn again into a temporary folder and compared pixel for pixel with the
committed PNG (same matplotlib: the repository's pinned environment); every text in it
is at least `MIN_FONT` points at `DPI`, and a tutorial page in each language shows it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from matplotlib.text import Text

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "tutorials"
spec = importlib.util.spec_from_file_location("diagrams", ROOT / "docs" / "hooks" / "diagrams.py")
diagrams = importlib.util.module_from_spec(spec)
spec.loader.exec_module(diagrams)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory) -> dict[str, Path]:
    return {path.name: path for path in diagrams.draw(tmp_path_factory.mktemp("diagrams"))}


@pytest.mark.parametrize("name", sorted(diagrams.FIGURES))
def test_the_committed_diagram_is_the_one_the_script_draws(name, drawn):
    committed, fresh = imread(TUTORIALS / "img" / name), imread(drawn[name])
    assert committed.shape == fresh.shape
    assert np.array_equal(committed, fresh), (
        f"run: .venv/bin/python docs/hooks/diagrams.py ({name})"
    )


@pytest.mark.parametrize("name", sorted(diagrams.FIGURES))
def test_the_diagram_is_readable_and_shown_in_both_languages(name):
    fig = diagrams.FIGURES[name]()
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text().strip()]
    assert sizes and min(sizes) >= diagrams.MIN_FONT
    width_px = fig.get_figwidth() * diagrams.DPI
    assert width_px >= 700  # wide enough to be read at the text column's width
    for suffix in (".md", ".ko.md"):
        pages = [
            p for p in TUTORIALS.glob(f"*{suffix}") if suffix == ".ko.md" or ".ko." not in p.name
        ]
        assert any(f"(img/{name})" in p.read_text(encoding="utf-8") for p in pages), suffix
