"""A MkDocs hook: every tutorial is also a Jupyter notebook, made at build time from the
page itself, with a download link at the top of the page.

jupytext reads the page's Markdown: each ```python block becomes a code cell (the
blocks tests/docs/test_docs_code.py runs, in the same order, so the notebook runs as
the page does) and the prose, ```output blocks included, becomes Markdown cells. The
English notebook is written next to the English page (`tutorials/NAME.ipynb`), the
Korean one next to the Korean page (`ko/tutorials/NAME.ipynb`, from `NAME.ko.md`).
tests/docs/test_notebooks.py runs one with nbclient.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import jupytext

# a ```python block indented under an admonition (an exercise's solution)
INDENTED_PYTHON = re.compile(r"^( +)```python *\n.*?^\1``` *$", re.MULTILINE | re.DOTALL)
KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}
LINK = {
    "en": "Download this tutorial as a notebook",
    "ko": "이 튜토리얼을 노트북으로 내려받기",
}


def is_tutorial(src_uri: str) -> bool:
    return src_uri.startswith("tutorials/") and src_uri.count("/") == 1


def notebook_name(src_uri: str) -> str:
    """`tutorials/01-attention-by-hand.ko.md` -> `01-attention-by-hand.ipynb`."""
    return Path(src_uri).name.removesuffix(".md").removesuffix(".ko") + ".ipynb"


def to_notebook(markdown: str) -> dict:
    """The page as a notebook (nbformat 4): its ```python blocks as code cells (an
    exercise's solution, indented in its folded admonition, too), and nothing else (a ```bash block, which the docs test does not run either, is shown as
    a shell session, not made a `%%bash` cell)."""
    markdown = re.sub(r"^```(bash|sh)\s*$", "```console", markdown, flags=re.MULTILINE)
    markdown = INDENTED_PYTHON.sub(lambda m: textwrap.dedent(m.group(0)), markdown)
    notebook = jupytext.reads(markdown, fmt="md")
    notebook.metadata = {"kernelspec": KERNEL, "language_info": {"name": "python"}}
    for cell in notebook.cells:
        cell.metadata = {}
    return json.loads(jupytext.writes(notebook, fmt="ipynb"))


def _language(config) -> str:
    plugin = config.plugins.get("i18n")
    return getattr(plugin, "current_language", None) or "en"


def on_page_markdown(markdown, page, config, files):
    if not is_tutorial(page.file.src_uri):
        return markdown
    name = notebook_name(page.file.src_uri)
    text = LINK.get(_language(config), LINK["en"])
    link = (
        f'<a class="md-button notebook-download" href="../{name}" download="{name}">'
        f"{text} (.ipynb)</a>"
    )
    lines = markdown.split("\n")
    title = next((i for i, line in enumerate(lines) if line.startswith("# ")), -1)
    lines.insert(title + 1, "\n" + link + "\n")
    return "\n".join(lines)


def on_post_page(output, page, config):
    """Write the notebook of a tutorial page next to its folder in the built site."""
    if is_tutorial(page.file.src_uri):
        source = Path(page.file.abs_src_path).read_text(encoding="utf-8")
        target = Path(config.site_dir) / Path(page.file.dest_uri).parent.parent
        target = target / notebook_name(page.file.src_uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(to_notebook(source), ensure_ascii=False, indent=1), "utf-8")
    return output
