"""Each tutorial is also a notebook (docs/hooks/notebooks.py), and the notebook runs.

The notebook of tutorial 1 (a few seconds of CPU) is made from its page as the site's
build makes it, opened with nbformat (and validated against the notebook schema), and
run cell by cell with nbclient in a fresh Python kernel, in an empty folder: it must
finish without an error and print what the page's ```output blocks show.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import nbformat
from mktestdocs import grab_code_blocks
from nbclient import NotebookClient
from test_docs_code import OUTPUT, missing_output

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "tutorials"
spec = importlib.util.spec_from_file_location("notebooks", ROOT / "docs" / "hooks" / "notebooks.py")
notebooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(notebooks)


def test_every_tutorial_s_notebook_holds_exactly_the_blocks_the_docs_test_runs():
    pages = sorted(TUTORIALS.glob("*.md"))
    assert len(pages) >= 20
    for page in pages:
        text = page.read_text(encoding="utf-8")
        notebook = nbformat.reads(json.dumps(notebooks.to_notebook(text)), as_version=4)
        nbformat.validate(notebook)
        code = [cell.source.strip() for cell in notebook.cells if cell.cell_type == "code"]
        assert code == [block.strip() for block in grab_code_blocks(text)], page.name
    assert notebooks.notebook_name("tutorials/01-attention-by-hand.ko.md") == (
        "01-attention-by-hand.ipynb"
    )


def test_tutorial_1_as_a_notebook_runs_and_prints_what_its_page_shows(tmp_path, monkeypatch):
    page = TUTORIALS / "01-attention-by-hand.md"
    path = tmp_path / notebooks.notebook_name("tutorials/01-attention-by-hand.md")
    path.write_text(json.dumps(notebooks.to_notebook(page.read_text("utf-8"))), "utf-8")
    notebook = nbformat.read(path, as_version=4)
    env_path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", env_path)  # the kernel imports aiayn from this checkout
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()  # fmt: skip
    printed = "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream"
    )
    shown = OUTPUT.findall(page.read_text(encoding="utf-8"))
    assert shown and missing_output(printed, shown) is None
    assert not [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs
                if o.output_type == "error"]  # fmt: skip
