"""The measured tables of README.md and docs/ equal what benchmarks/report renders
from the results files.

A figure edited by hand in README or a docs page, or a results file re-measured without
`python -m benchmarks.report --write`, fails here. Reads files only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report():
    from benchmarks import report

    return report


@pytest.fixture(scope="module")
def texts(report) -> dict[str, str]:
    """README.md and every docs page, by name."""
    return {report.document_name(p): p.read_text(encoding="utf-8") for p in report.documents()}


def holding(texts: dict[str, str], name: str) -> str:
    """The name of the first document that holds table `name`."""
    return next(doc for doc, text in texts.items() if f"<!-- report:{name} -->" in text)


def test_the_documents_are_readme_and_every_docs_page(report, texts):
    assert "README.md" in texts and "docs/explanation/results/speed.md" in texts
    assert "<!-- report:goals -->" in texts["README.md"]  # the goals table stays in README


def test_readme_tables_match_the_committed_results(report, texts):
    assert report.stale(texts, report.render_all()) == []


def test_each_table_names_its_file_and_what_the_file_lacks(report):
    for name, text in report.render_all().items():
        assert "`benchmarks/results/" in text, name
        for source in (line for line in text.splitlines() if line.startswith("Source: ")):
            data = json.loads((ROOT / source.split("`")[1]).read_text())
            record = re.match(r"Source: `[^`]+` record `([^`]+)`", source)
            if record:  # a table from one record of the file
                data = data[record.group(1)]
            recorded = {
                "CPU flags": "cpu_flags" in data or "CPU features" in source,
                "commit": bool(data.get("commit") or data.get("library", {}).get("commit")),
                "command": bool(data.get("command")),
            }
            missing = [field for field, present in recorded.items() if not present]
            if missing:
                assert source.endswith(f"does not say its {', '.join(missing)}."), source
            else:
                assert "does not say" not in source, source


def test_a_figure_changed_by_hand_is_caught(report, texts):
    rendered = report.render_all()
    name = next(iter(rendered))
    doc = holding(texts, name)
    figure = next(cell for cell in rendered[name].split(" | ") if cell[:1].isdigit())
    start = texts[doc].index(f"<!-- report:{name} -->")
    at = texts[doc].index(figure, start)
    edited = {**texts, doc: texts[doc][:at] + "9" + texts[doc][at:]}
    complaint = f"{doc}: {name}: differs from what report.py renders from the results files"
    assert complaint not in report.stale(texts, rendered)
    assert complaint in report.stale(edited, rendered)


def test_a_missing_block_and_an_unknown_block_are_named(report, texts):
    rendered = report.render_all()
    name = next(iter(rendered))
    without = {
        doc: text.replace(f"<!-- report:{name} -->", "").replace(f"<!-- /report:{name} -->", "")
        for doc, text in texts.items()
    }
    without["docs/extra.md"] = "<!-- report:nonesuch -->\nx\n<!-- /report:nonesuch -->\n"
    complaints = report.stale(without, rendered)
    assert f"{name}: no <!-- report:{name} --> block in README.md or docs/" in complaints
    assert "docs/extra.md: nonesuch: no such table in report.py" in complaints


def test_a_table_may_sit_in_several_documents_each_checked(report, texts):
    rendered = report.render_all()
    block = f"<!-- report:goals -->\n{rendered['goals']}\n<!-- /report:goals -->\n"
    assert report.stale({**texts, "docs/copy.md": block}, rendered) == []
    stale_copy = block.replace(rendered["goals"], "old")
    assert report.stale({**texts, "docs/copy.md": stale_copy}, rendered) == [
        "docs/copy.md: goals: differs from what report.py renders from the results files"
    ]


def test_write_makes_a_stale_document_current(report, texts):
    rendered = report.render_all()
    name = next(iter(rendered))
    doc = holding(texts, name)
    start = texts[doc].index(f"<!-- report:{name} -->")
    end = texts[doc].index(f"<!-- /report:{name} -->")
    emptied = {
        **texts,
        doc: texts[doc][:start] + f"<!-- report:{name} -->\nold\n" + texts[doc][end:],
    }
    assert report.stale(emptied, rendered) != []
    current = {**emptied, doc: report.updated(emptied[doc], rendered)}
    assert report.stale(current, rendered) == []
