"""README's measured tables equal what benchmarks/report.py renders from the results files.

A figure edited by hand in README, or a results file re-measured without
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
def readme() -> str:
    return (ROOT / "README.md").read_text()


def test_readme_tables_match_the_committed_results(report, readme):
    assert report.stale(readme, report.render_all()) == []


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


def test_a_figure_changed_by_hand_is_caught(report, readme):
    rendered = report.render_all()
    name = next(iter(rendered))
    figure = next(cell for cell in rendered[name].split(" | ") if cell[:1].isdigit())
    start = readme.index(f"<!-- report:{name} -->")
    at = readme.index(figure, start)
    edited = readme[:at] + "9" + readme[at:]
    complaint = f"{name}: differs from what report.py renders from the results files"
    assert complaint not in report.stale(readme, rendered)
    assert complaint in report.stale(edited, rendered)


def test_a_missing_block_and_an_unknown_block_are_named(report, readme):
    rendered = report.render_all()
    name = next(iter(rendered))
    without = readme.replace(f"<!-- report:{name} -->", "").replace(f"<!-- /report:{name} -->", "")
    extra = without + "\n<!-- report:nonesuch -->\nx\n<!-- /report:nonesuch -->\n"
    complaints = report.stale(extra, rendered)
    assert f"{name}: no <!-- report:{name} --> block in README" in complaints
    assert "nonesuch: no such table in report.py" in complaints


def test_write_makes_a_stale_readme_current(report, readme):
    rendered = report.render_all()
    name = next(iter(rendered))
    start = readme.index(f"<!-- report:{name} -->")
    end = readme.index(f"<!-- /report:{name} -->")
    emptied = readme[:start] + f"<!-- report:{name} -->\nold\n" + readme[end:]
    assert report.stale(emptied, rendered) != []
    assert report.stale(report.updated(emptied, rendered), rendered) == []
