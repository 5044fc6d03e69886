"""The docs' Python runs as written, and shows what it prints.

Each English page under docs/ (`*.md`, not `*.ko.md`) with ```python blocks is one
test: its blocks run in order in ONE namespace (mktestdocs' `check_md_file(path,
memory=True)`), in a fresh Python process whose working directory is an empty
temporary folder. A block fenced ```py is shown as Python and not run; ```bash blocks
are not run here. An ```output block shows what the code before it prints: its lines
must appear in what the page printed, each block after the previous one.

An ```output-varies block shows output that comes out of training, whose figures differ
from one CPU to another (other SIMD widths and kernels sum floats in other orders): it
is matched by its shape, each number in it standing for any number, and the rest as
written (runs of spaces may differ, for columns that widen). Exact output stays in
```output blocks wherever the arithmetic is exact or the same on every CPU.

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
OUTPUT = re.compile(r"^```(output|output-varies)\n(.*?)^```", re.DOTALL | re.MULTILINE)
NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*")
RUN = "import sys; from mktestdocs import check_md_file; check_md_file(sys.argv[1], memory=True)"


def english_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if not p.name.endswith(".ko.md"))


# A page whose code trains (a backward pass, an optimizer step, a recipe trained) shows
# results that depend on the CPU's float sums: marked `trains`, it runs a second time under
# another CPU's kernels in `make test` (Makefile, tests/variants/kernels.py).
TRAINS = re.compile(r"\.backward\(|\.step\(\)|train_from_recipe\(")


def pages_with_code() -> list[Path]:
    return [p for p in english_pages() if grab_code_blocks(p.read_text(encoding="utf-8"))]


def page_params() -> list:
    params = []
    for page in pages_with_code():
        trains = any(TRAINS.search(block) for block in grab_code_blocks(page.read_text("utf-8")))
        params.append(pytest.param(page, marks=[pytest.mark.trains] if trains else []))
    return params


def shape_pattern(block: str) -> re.Pattern[str]:
    """An ```output-varies block as a pattern: any number where it shows one, any run of
    spaces where it shows one, everything else as written."""
    pattern = []
    for piece in re.split(r"([-+]?\d+(?:[.,]\d+)*| +)", block.rstrip("\n")):
        if NUMBER.fullmatch(piece):
            pattern.append(NUMBER.pattern)
        elif piece and piece.strip(" ") == "":
            pattern.append(" +")
        else:
            pattern.append(re.escape(piece))
    return re.compile("".join(pattern))


def missing_output(printed: str, shown: list[tuple[str, str]]) -> str | None:
    """The first output block not found in `printed` after the previous one, or None.

    `shown` holds (kind, text) pairs: kind "output" is matched as written, kind
    "output-varies" by its shape (`shape_pattern`).
    """
    at = 0
    for kind, block in shown:
        if kind == "output-varies":
            match = shape_pattern(block).search(printed, at)
            if match is None:
                return block
            at = match.end()
            continue
        found = printed.find(block.rstrip("\n"), at)
        if found < 0:
            return block
        at = found + len(block.rstrip("\n"))
    return None


def page_threads() -> int:
    """Threads for one page's process: the cores shared among pytest-xdist's workers, so that
    two pages running at once do not ask 2 cores for 4 threads (OpenMP's threads then wait
    on each other). A page that wants fewer sets them itself."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // workers)


@pytest.mark.parametrize("page", page_params(), ids=lambda p: str(p.relative_to(DOCS)))
def test_the_page_s_python_runs_and_prints_what_it_shows(page, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    env.setdefault("OMP_NUM_THREADS", str(page_threads()))
    result = subprocess.run(
        [sys.executable, "-c", RUN, str(page)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{page}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    shown = OUTPUT.findall(page.read_text(encoding="utf-8"))
    if os.environ.get("AIAYN_SEED_SHIFT", "0") != "0":
        # The portability audit's other seeds (tests/variants): every seeded figure moves,
        # and so do sampled data (tutorial 8's sentences and masks): the page's asserts
        # carry its claims there; its blocks are checked at the page's own seed, under
        # both kernel sets (make test's two passes).
        shown = []
    block = missing_output(result.stdout, shown)
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
    exact = [("output", "(2, 5, 100)\n"), ("output", "loss 1.5\n")]
    assert missing_output(printed, exact) is None
    assert missing_output(printed, exact[::-1]) == "(2, 5, 100)\n"
    assert missing_output(printed, [("output", "(2, 5, 101)\n")]) == "(2, 5, 101)\n"


def test_output_that_varies_is_matched_by_its_shape_not_its_digits():
    printed = "agreement  length 3\nsinusoidal      100%       5%\nbest valid NLL 0.110 at 300\n"
    shown = "sinusoidal       93%       5%\nbest valid NLL 0.104 at 225\n"
    assert missing_output(printed, [("output-varies", shown)]) is None
    assert missing_output(printed, [("output", shown)]) == shown  # digits differ
    # The words and the number of figures still count.
    for wrong in ("rotary       93%       5%\n", "sinusoidal  93%  5%  7%\n", "best NLL 0.1\n"):
        assert missing_output(printed, [("output-varies", wrong)]) == wrong
    assert missing_output("loss -1.5\n", [("output-varies", "loss 2\n")]) is None


def test_only_python_blocks_run():
    page = "```python\na = 1\n```\n\n```py\nnot run\n```\n\n```bash\nrm -rf /\n```\n"
    assert grab_code_blocks(page) == ["a = 1\n"]
