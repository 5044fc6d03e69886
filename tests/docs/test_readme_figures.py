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
    complaint = f"{doc}: {name}: differs from what the report renders from the results files"
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
    assert "docs/extra.md: nonesuch: no such table in the report" in complaints


def test_a_table_may_sit_in_several_documents_each_checked(report, texts):
    rendered = report.render_all()
    # The goals table reads two older files on purpose; a page that shows it says why.
    why = (
        "bf16 rows from the older harness, which alone ran bf16.<!-- older: decode -->\n"
        "GPT rows from the cells not measured again.<!-- older: generate -->\n\n"
    )
    block = f"{why}<!-- report:goals -->\n{rendered['goals']}\n<!-- /report:goals -->\n"
    assert report.stale({**texts, "docs/copy.md": block}, rendered) == []
    stale_copy = block.replace(rendered["goals"], "old")
    assert report.stale({**texts, "docs/copy.md": stale_copy}, rendered) == [
        "docs/copy.md: goals: differs from what the report renders from the results files"
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


# ----- issue 48: the newest fair source, and one verdict per goal ---------------------------


def test_every_results_file_says_what_it_measures(report):
    for path in sorted(report.RESULTS.glob("*.json")):
        found = report.measures(json.loads(path.read_text()))
        assert found, f"{path.name}: no `measures` record"
        for record in found:
            assert set(record) == {"system", "cell", "harness"}, path.name
            assert all(isinstance(v, str) and v for v in record.values()), path.name


def test_a_newer_file_of_the_same_measurement_supersedes_an_older_one(report):
    """serve.json (2026-11-24, load not recorded) and serve-dynamic.json (the quiet run)
    measure the same server in the same cell; generate-engine.json re-measured one cell
    of generate.json; nothing supersedes the newer files."""
    index = report.measurements()
    assert list(report.superseding("serve", index)) == ["serve-dynamic"]
    assert list(report.superseding("generate", index)) == ["generate-engine"]
    assert report.superseding("serve-dynamic", index) == {}
    assert report.superseding("generate-1thread", index) == {}  # its cell was not re-measured


def test_a_planted_stale_figure_is_caught(report, texts):
    """A figure marked from a superseded file (serve.json's 2.69x, which serve-dynamic.json
    measured again), or a table rendered from one, fails unless the page says why."""
    rendered = report.render_all()
    stale_prose = (
        "Batching gives 2.69x<!-- figure: serve:cells[clients=16,server=batching].speedup -->.\n"
    )
    stale_table = f"<!-- report:serve -->\n{rendered['serve']}\n<!-- /report:serve -->\n"
    for planted in (stale_prose, stale_table):
        found = report.stale({**texts, "docs/stale.md": planted}, rendered)
        assert any(
            line.startswith("docs/stale.md: benchmarks/results/serve.json is superseded by")
            and "serve-dynamic.json" in line
            for line in found
        ), found
        said = planted + "Kept for its comparison with the greedy run.<!-- older: serve -->\n"
        assert not any(
            line.startswith("docs/stale.md")
            for line in report.stale({**texts, "docs/stale.md": said}, rendered)
        )


@pytest.mark.parametrize(
    "sentence",
    [
        "The goal is met.",
        "Generation at batch 1 meets its goal of 1.5x.",
        "Where the goal is missed: GPT-2 small.",
        "목표를 겨우 달성합니다.",
    ],
)
def test_a_hand_written_verdict_is_caught(report, texts, sentence):
    rendered = report.render_all()
    found = report.stale({**texts, "docs/verdict.md": f"Intro.\n\n{sentence}\n"}, rendered)
    assert (
        [line for line in found if line.startswith("docs/verdict.md")]
        == [line for line in found if line.startswith("docs/verdict.md:3: ")]
        != []
    )
    assert "is a verdict written by hand" in next(
        x for x in found if x.startswith("docs/verdict.md")
    )


def test_a_verdict_span_renders_the_goals_one_verdict(report, texts):
    """The ListOps goal (full attention at 30% or more; 35.8% measured) is met: a span
    that says otherwise is stale, --write renders it, in the page's language."""
    from benchmarks.report import pages, verdicts

    goal = verdicts.all_goals()["listops"]
    assert goal.met is (min(goal.values) >= 0.3)  # the goal's own definition
    rendered, said = report.render_all(), pages.render_verdicts()
    wrong = "The goal: <!-- verdict:listops -->not met<!-- /verdict -->.\n"
    found = report.stale({**texts, "docs/v.md": wrong}, rendered, said)
    assert "docs/v.md: verdict:listops: says 'not met', the goal is 'met'" in found
    assert report.updated(wrong, rendered, said, "en") == wrong.replace("not met", "met")
    assert report.updated(wrong, rendered, said, "ko") == wrong.replace("not met", "달성")
    unknown = "<!-- verdict:nonesuch -->met<!-- /verdict -->\n"
    found = report.stale({**texts, "docs/v.md": unknown}, rendered, said)
    assert "docs/v.md: verdict:nonesuch: no such goal (with a threshold)" in found
    # the goals table's "met" column says the same as the span
    row = next(r for r in rendered["goals"].splitlines() if r.startswith("| aiayn's ListOps"))
    assert row.endswith("| yes |")


TRANSCRIPT = "```text\ntrain: 3,565 steps\nbudget: 15,252 tok/s\n\nBLEU 24.72 (nrefs:1)\n```\n"


def test_a_quickstart_transcript_names_its_commit_and_machine(report, texts):
    """Issue 48, item 12: a transcript with no results file behind it is marked as an
    example from a named commit, machine and date, or it fails."""
    rendered = report.render_all()
    bare = f"Its output:\n\n{TRANSCRIPT}"
    found = report.stale({**texts, "docs/qs.md": bare}, rendered)
    assert any(line.startswith("docs/qs.md:3: a quickstart transcript") for line in found)
    marked = f'Its output:\n\n<!-- example: commit 8d72dde, "AMD EPYC, 2 cores", 2026-11-25 -->\n\n{TRANSCRIPT}'
    assert not any(
        line.startswith("docs/qs.md")
        for line in report.stale({**texts, "docs/qs.md": marked}, rendered)
    )
    unnamed = marked.replace("commit 8d72dde, ", "")  # no commit: not a marker
    found = report.stale({**texts, "docs/qs.md": unnamed}, rendered)
    assert any(line.startswith("docs/qs.md:5: a quickstart transcript") for line in found)
