"""Each tutorial ends with two or three exercises, each with its solution folded under
it (a `??? success` admonition holding a ```python block), in both languages.

The solutions are ```python blocks like any other, so tests/docs/test_docs_code.py runs
them with the page (they must pass as written) and checks that the Korean page holds
the same ones; this test checks the exercises are there and their solutions hidden.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TUTORIALS = Path(__file__).resolve().parents[2] / "docs" / "tutorials"
SECTION = {".md": ("## Try it yourself", "Solution"), ".ko.md": ("## 직접 해 보기", "풀이")}
# The first ten tutorials; later ones are welcome to follow.
PAGES = [p for p in sorted(TUTORIALS.glob("*.md")) if re.match(r"(0\d|10)-", p.name)]


def exercises(text: str, heading: str, label: str) -> list[str]:
    """The solutions' code under `heading`: each a folded admonition titled `label`
    whose body is one ```python block."""
    assert heading in text, heading
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(
        rf'^\?\?\? success "{label}"\n\n    ```python\n(.*?)^    ```$', section, re.M | re.S
    )


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_the_tutorial_ends_with_two_or_three_exercises_with_hidden_solutions(page):
    suffix = ".ko.md" if page.name.endswith(".ko.md") else ".md"
    text = page.read_text(encoding="utf-8")
    solutions = exercises(text, *SECTION[suffix])
    assert 2 <= len(solutions) <= 3
    assert all("assert " in code for code in solutions)  # each checks its answer
    prompts = re.findall(r"^\*\*(\d)\. [^*]+\.\*\* \S", text, re.M)
    assert prompts[-len(solutions) :] == [str(i + 1) for i in range(len(solutions))]


def test_a_solution_that_is_open_or_outside_its_admonition_is_not_counted():
    folded = (
        '## Try it yourself\n\n??? success "Solution"\n\n    ```python\n    assert 1\n    ```\n'
    )
    assert exercises(folded, *SECTION[".md"]) == ["    assert 1\n"]
    opened = folded.replace("??? success", "!!! success")
    assert exercises(opened, *SECTION[".md"]) == []
