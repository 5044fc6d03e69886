"""The docs' Python runs as written, and shows what it prints.

Each English page under docs/ (`*.md`, not `*.ko.md`) with ```python blocks is one
test: its blocks run in order in ONE namespace (mktestdocs' `check_md_file(path,
memory=True)`), in a fresh Python process whose working directory is an empty
temporary folder. A block fenced ```py is shown as Python and not run; ```bash blocks
are not run here. An ```output block shows what the code before it prints: its lines
must appear in what the page printed, each block after the previous one.

A Korean page (`page.ko.md`) must hold the same ```python blocks as its English page,
so the code cannot drift between the languages (docs/contributing.md).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mktestdocs import grab_code_blocks

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
OUTPUT = re.compile(r"^```output\n(.*?)^```", re.DOTALL | re.MULTILINE)
RUN = "import sys; from mktestdocs import check_md_file; check_md_file(sys.argv[1], memory=True)"


def english_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if not p.name.endswith(".ko.md"))


def pages_with_code() -> list[Path]:
    return [p for p in english_pages() if grab_code_blocks(p.read_text(encoding="utf-8"))]


def missing_output(printed: str, shown: list[str]) -> str | None:
    """The first ```output block not found in `printed` after the previous one, or None."""
    at = 0
    for block in shown:
        found = printed.find(block.rstrip("\n"), at)
        if found < 0:
            return block
        at = found + len(block.rstrip("\n"))
    return None


@pytest.mark.parametrize("page", pages_with_code(), ids=lambda p: str(p.relative_to(DOCS)))
def test_the_page_s_python_runs_and_prints_what_it_shows(page, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", RUN, str(page)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{page}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    block = missing_output(result.stdout, OUTPUT.findall(page.read_text(encoding="utf-8")))
    assert block is None, (
        f"{page} shows output its code did not print:\n{block}\nprinted:\n{result.stdout[-3000:]}"
    )


@pytest.mark.parametrize(
    "korean",
    sorted(DOCS.rglob("*.ko.md")),
    ids=lambda p: str(p.relative_to(DOCS)),
)
def test_a_korean_page_runs_the_same_code_as_its_english_page(korean):
    english = korean.with_name(korean.name.replace(".ko.md", ".md"))
    assert english.is_file(), f"{korean} has no English page {english.name}"
    assert grab_code_blocks(korean.read_text(encoding="utf-8")) == grab_code_blocks(
        english.read_text(encoding="utf-8")
    )


def test_shown_output_is_found_in_order_and_a_wrong_one_is_named():
    printed = "loading\n(2, 5, 100)\nloss 1.5\n"
    assert missing_output(printed, ["(2, 5, 100)\n", "loss 1.5\n"]) is None
    assert missing_output(printed, ["loss 1.5\n", "(2, 5, 100)\n"]) == "(2, 5, 100)\n"
    assert missing_output(printed, ["(2, 5, 101)\n"]) == "(2, 5, 101)\n"


def test_only_python_blocks_run():
    page = "```python\na = 1\n```\n\n```py\nnot run\n```\n\n```bash\nrm -rf /\n```\n"
    assert grab_code_blocks(page) == ["a = 1\n"]
