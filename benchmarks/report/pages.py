"""The documents: which table each marker names, rendering them all, and the
`--write` / `--check` command line."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks import report
from benchmarks.report import BLOCK, NAMED
from benchmarks.report.analysis import (
    alignment,
    export,
    hooks,
    induction,
    induction_causes_repeated,
    induction_repeated,
    positions_bible,
    positions_extrapolation,
    pruning,
    shapes,
)
from benchmarks.report.bound import step_bound
from benchmarks.report.cpu_inference import int8_kernels, memory, quality, quality_seeds
from benchmarks.report.efficient import (
    attention,
    cost_and_loss,
    efficient_attention,
    efficient_positions,
    efficient_task,
    recall,
    sdpa_backends,
    sliding_window,
)
from benchmarks.report.engine import (
    batch_order,
    generate,
    generate_engine,
    serve,
    step_overhead,
    translate_file,
)
from benchmarks.report.runs import (
    has_quickstart_runs,
    host_memory,
    quickstart,
    train_profile,
    valid_searches,
    valid_variants,
)
from benchmarks.report.speed import (
    decode,
    decode_cells,
    decode_latency,
    decode_memory,
    decode_vs_commit,
    gpu_decode,
    gpu_train,
    has_cells,
    kernels,
    train,
    train_compile,
)
from benchmarks.report.verdicts import VERDICTS, all_goals, goals

# bench_recall's results files, each a table of its own name (trained, and the circuit;
# recall-mqar-seeds: --grid cpu-seeds)
RECALL_RESULTS = (
    *(
        f"recall-{task}{mode}"
        for task in ("mqar", "distance-copy", "selective-copy")
        for mode in ("-circuit", "")
    ),
    "recall-mqar-seeds",
)

TABLES: dict[str, Callable[[], str]] = {
    "goals": goals,
    "train": train,
    "train-compile": train_compile,
    "decode": decode,
    "decode-latency": decode_latency,
    "decode-vs-2d41774": decode_vs_commit,
    "decode-cells": decode_cells,
    "decode-fair-cells": lambda: decode_cells("decode-fair"),
    "decode-memory": decode_memory,
    "kernels": kernels,
    "attention": attention,
    "sliding-window": sliding_window,
    "efficient-attention": efficient_attention,
    "gpu-attention": lambda: attention("attention-gpu"),
    "gpu-sliding-window": lambda: sliding_window("attention-gpu"),
    "gpu-efficient-attention": lambda: efficient_attention("attention-gpu"),
    "gpu-sdpa-backends": sdpa_backends,
    "gpu-train": gpu_train,
    "translate": translate_file,
    "serve-continuous": lambda: serve("serve-continuous"),
    "serve-dynamic": lambda: serve("serve-dynamic"),
    "serve-continuous-rows": lambda: serve("serve-continuous-rows"),
    "serve-continuous-groups": lambda: serve("serve-continuous-groups"),
    "serve-dynamic-xeon": lambda: serve("serve-dynamic-xeon"),
    "serve-continuous-xeon": lambda: serve("serve-continuous-xeon"),
    "batch-order-xeon": batch_order,
    "generate-engine": generate_engine,
    "step-overhead": step_overhead,
    "gpu-decode": gpu_decode,
    "efficient-listops": lambda: efficient_task("efficient-listops"),
    "efficient-bible-genre": lambda: efficient_task("efficient-bible-genre"),
    "efficient-charlm": lambda: efficient_task("efficient-charlm"),
    "efficient-charlm-cpu": lambda: efficient_task("efficient-charlm-cpu"),
    "efficient-charlm-cpu-positions": lambda: efficient_positions("efficient-charlm-cpu"),
    **{name: lambda name=name: recall(name) for name in RECALL_RESULTS},
    "efficient-cost-loss": cost_and_loss,
    "positions-extrapolation": positions_extrapolation,
    "positions-bible": positions_bible,
    "pruning": pruning,
    "serve": lambda: serve("serve"),
    "serve-greedy": lambda: serve("serve-greedy"),
    "serve-wait50": lambda: serve("serve-wait50"),
    "shapes": shapes,
    "generate": lambda: generate("generate"),
    "generate-1thread": lambda: generate("generate-1thread"),
    "quickstart": quickstart,
    "train-profile": train_profile,
    "quality": quality,
    "quality-seeds": quality_seeds,
    "valid-variants": valid_variants,
    "valid-variants-2threads": lambda: valid_variants("valid-sweep-2threads"),
    "valid-variants-xeon": lambda: valid_variants("valid-sweep-xeon"),
    "valid-variants-xeon-v4": lambda: valid_variants("valid-sweep-xeon-v4"),
    "valid-searches": valid_searches,
    "valid-variants-xeon-dropout": lambda: valid_variants("valid-sweep-xeon-dropout"),
    "valid-searches-xeon-dropout": lambda: valid_searches(
        "valid-sweep-xeon-dropout", ("model.dropout=0.1",)
    ),
    "induction": induction,
    "induction-repeated": induction_repeated,
    "induction-heads-attempts": lambda: induction_repeated("induction-heads-attempts"),
    "induction-causes-repeated": induction_causes_repeated,
    "alignment": alignment,
    "export": export,
    "hooks": hooks,
    "memory": memory,
    "int8-kernels": int8_kernels,
    "int8-kernels-amx": lambda: int8_kernels("int8-kernels-amx"),
    "step-bound": step_bound,
    "step-bound-xeon": lambda: step_bound("step-bound-xeon"),
    "train-profile-bf16": lambda: train_profile("train-profile-bf16"),
    "train-profile-bf16-xeon": lambda: train_profile("train-profile-bf16-xeon"),
    "host-memory": host_memory,
}


def recorded(name: str) -> Callable[[], bool]:
    """Whether RESULTS/NAME.json exists, asked when the tables are rendered."""
    return lambda: (report.RESULTS / f"{name}.json").exists()


# Tables rendered only once their results exist (README gains their blocks with them).
WHEN = {
    "decode-cells": has_cells,
    "decode-fair-cells": lambda: has_cells("decode-fair"),
    "decode-memory": lambda: has_cells("decode-fair"),
    "quickstart": has_quickstart_runs,
    "train-profile": recorded("train-profile"),
    "quality": recorded("quality"),
    "quality-seeds": recorded("quality-seeds"),
    "valid-variants": recorded("valid-sweep"),
    "valid-variants-2threads": recorded("valid-sweep-2threads"),
    "valid-variants-xeon": recorded("valid-sweep-xeon"),
    "valid-variants-xeon-v4": recorded("valid-sweep-xeon-v4"),
    "valid-searches": recorded("valid-sweep"),
    "valid-variants-xeon-dropout": recorded("valid-sweep-xeon-dropout"),
    "valid-searches-xeon-dropout": recorded("valid-sweep-xeon-dropout"),
    "induction": recorded("induction"),
    "induction-repeated": recorded("induction-repeated"),
    "induction-heads-attempts": recorded("induction-heads-attempts"),
    "induction-causes-repeated": recorded("induction-causes-repeated"),
    "alignment": recorded("alignment"),
    "export": recorded("export"),
    "hooks": recorded("hooks"),
    "memory": recorded("memory"),
    "int8-kernels": recorded("int8-kernels"),
    "int8-kernels-amx": recorded("int8-kernels-amx"),
    "step-bound": recorded("step-bound"),
    "step-bound-xeon": recorded("step-bound-xeon"),
    "efficient-attention": lambda: "efficient" in report.load("attention"),
    "train-profile-bf16": recorded("train-profile-bf16"),
    "train-profile-bf16-xeon": recorded("train-profile-bf16-xeon"),
    "host-memory": recorded("host-memory"),
    "gpu-attention": recorded("attention-gpu"),
    "gpu-sliding-window": recorded("attention-gpu"),
    "gpu-efficient-attention": recorded("attention-gpu"),
    "gpu-sdpa-backends": recorded("attention-gpu"),
    "gpu-train": recorded("train-gpu-big"),
    "translate": recorded("translate"),
    "serve-continuous": recorded("serve-continuous"),
    "serve-dynamic": recorded("serve-dynamic"),
    "serve-continuous-rows": recorded("serve-continuous-rows"),
    "serve-continuous-groups": recorded("serve-continuous-groups"),
    "serve-dynamic-xeon": recorded("serve-dynamic-xeon"),
    "serve-continuous-xeon": recorded("serve-continuous-xeon"),
    "batch-order-xeon": recorded("batch-order-xeon"),
    "generate-engine": recorded("generate-engine"),
    "step-overhead": recorded("step-overhead"),
    "gpu-decode": recorded("decode-gpu-b256"),
    "efficient-listops": recorded("efficient-listops"),
    "efficient-bible-genre": recorded("efficient-bible-genre"),
    "efficient-charlm": recorded("efficient-charlm"),
    "efficient-charlm-cpu": recorded("efficient-charlm-cpu"),
    "efficient-charlm-cpu-positions": recorded("efficient-charlm-cpu"),
    **{name: recorded(name) for name in RECALL_RESULTS},
    "efficient-cost-loss": lambda: all(
        recorded(f"recall-{task}-circuit")() for task in ("mqar", "distance-copy", "selective-copy")
    ),
}


def render_all() -> dict[str, str]:
    return {name: render() for name, render in TABLES.items() if name not in WHEN or WHEN[name]()}


def documents() -> list[Path]:
    """The files whose blocks are rendered: README.md and every docs page."""
    return [report.README, *sorted(report.DOCS.rglob("*.md"))]


def document_name(path: Path) -> str:
    """A document's path as messages name it (relative to the repository)."""
    return str(path.relative_to(report.ROOT)) if path.is_relative_to(report.ROOT) else str(path)


def blocks(text: str) -> dict[str, str]:
    """A document's rendered blocks: marker name -> the text between the markers."""
    return {m.group(1): m.group(2) for m in BLOCK.finditer(text)}


# A goal's verdict in prose, rendered from `verdicts.all_goals` as tables are:
# "The goal is <!-- verdict:gpu-mfu -->not met<!-- /verdict -->."
VERDICT = re.compile(r"<!-- verdict:([a-z0-9-]+) -->(.*?)<!-- /verdict -->")
# A verdict written by hand: what the prose may not say outside a verdict span.
HAND_VERDICT = re.compile(
    r"\b(?:met|meets?|missed|miss(?:es)?|achieved|fell short|falls short)\b|달성|미달|충족",
    re.IGNORECASE,
)
FIGURE_MARKER = re.compile(r"<!-- figure: ([^>]*?) -->")
FENCED = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
NOT_PROSE = re.compile(r"`[^`\n]*`|<!--.*?-->|\]\([^)]*\)", re.DOTALL)


# A quickstart transcript (a text block with its `train:` and `BLEU` lines) that is not
# rendered from a results file says whose run it is, just before its fence.
TRANSCRIPT = re.compile(r"^```text\n(?:(?!^```).)*?^train: .*?^BLEU \d", re.DOTALL | re.MULTILINE)
EXAMPLE = re.compile(r'<!-- example: commit [0-9a-f]{7,40}, "[^"]+", \d{4}-\d{2}-\d{2} -->\n\n?$')
# Pages whose transcripts are exempt from the marker (none now).
TRANSCRIPTS_ELSEWHERE: tuple[str, ...] = ()


def unmarked_transcripts(name: str, text: str) -> list[str]:
    """Each quickstart transcript of a document not marked as an example from a named
    commit, machine and date (`EXAMPLE`, just before the fence), one line each."""
    if name in TRANSCRIPTS_ELSEWHERE:
        return []
    return [
        f"{name}:{text.count(chr(10), 0, match.start()) + 1}: a quickstart transcript neither "
        'rendered from a results file nor marked <!-- example: commit HASH, "MACHINE", '
        "YYYY-MM-DD --> just before it"
        for match in TRANSCRIPT.finditer(text)
        if not EXAMPLE.search(text[: match.start()])  # the marker ends where the fence begins
    ]


def render_verdicts() -> dict[str, dict[str, str]]:
    """Each goal with a threshold: its verdict in each language (`verdicts.VERDICTS`)."""
    return {
        name: {language: words[goal.met] for language, words in VERDICTS.items()}
        for name, goal in all_goals().items()
        if goal.met is not None
    }


def language(name: str) -> str:
    """A document's language: "ko" for a Korean twin (X.ko.md), else "en"."""
    return "ko" if name.endswith(".ko.md") else "en"


def prose(text: str) -> str:
    """`text` with its rendered blocks, verdict spans, code, comments and link targets
    blanked (line numbers kept)."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    for pattern in (BLOCK, VERDICT, FENCED, NOT_PROSE):
        text = pattern.sub(blank, text)
    return text


def hand_verdicts(name: str, text: str) -> list[str]:
    """Each verdict of a goal written by hand in a document's prose, one line each."""
    return [
        f"{name}:{number}: {match.group(0)!r} is a verdict written by hand: render the "
        "goal's verdict with <!-- verdict:NAME -->...<!-- /verdict --> (benchmarks/report/"
        "verdicts.py), or say what was measured against what without a verdict"
        for number, line in enumerate(prose(text).splitlines(), 1)
        for match in HAND_VERDICT.finditer(line)
    ]


def shown_files(text: str, rendered: dict[str, str]) -> list[str]:
    """The results files a document shows: those its tables' Source lines name and those
    its figure markers name."""
    names = [
        n for table in blocks(text) if table in rendered for n in NAMED.findall(rendered[table])
    ]
    for marker in FIGURE_MARKER.findall(text):
        names += [source.partition(":")[0] for source in marker.split()]
    return names


def stale(
    texts: dict[str, str],
    rendered: dict[str, str],
    verdicts: dict[str, dict[str, str]] | None = None,
) -> list[str]:
    """Each problem with the documents, one line each (empty: all up to date).

    Args:
        texts: each document's name (README.md, docs/...) and its text.
        rendered: each table's name and its rendering (`render_all`).
        verdicts: each goal's verdict by language (`render_verdicts`, the default).

    Returns:
        A table that no document holds; per document, a block that names no table, or
        one that differs from its rendering; a verdict span that names no goal or differs
        from the goal's verdict; a verdict written by hand; a results file shown that a
        newer one supersedes, where the page does not say why; a results file without
        its `measures` record.
    """
    verdicts = render_verdicts() if verdicts is None else verdicts
    found = {name: blocks(text) for name, text in texts.items()}
    held = {table for tables in found.values() for table in tables}
    problems = [
        f"{table}: no <!-- report:{table} --> block in README.md or docs/"
        for table in rendered
        if table not in held
    ]
    index = report.measurements()
    problems += [
        f"benchmarks/results/{name}.json: no `measures` record (system, cell, harness)"
        for name, (_, measured) in index.items()
        if not measured
    ]
    for name, tables in found.items():
        problems += [
            f"{name}: {table}: no such table in the report"
            for table in tables
            if table not in rendered
        ]
        problems += [
            f"{name}: {table}: differs from what the report renders from the results files"
            for table in rendered
            if table in tables and tables[table] != rendered[table] + "\n"
        ]
        for match in VERDICT.finditer(texts[name]):
            goal, said = match.groups()
            if goal not in verdicts:
                problems.append(f"{name}: verdict:{goal}: no such goal (with a threshold)")
            elif said != verdicts[goal][language(name)]:
                problems.append(
                    f"{name}: verdict:{goal}: says {said!r}, the goal is "
                    f"{verdicts[goal][language(name)]!r}"
                )
        problems += hand_verdicts(name, texts[name])
        problems += unmarked_transcripts(name, texts[name])
        problems += [
            f"{name}: {line}"
            for line in report.older_sources(texts[name], shown_files(texts[name], rendered), index)
        ]
    return problems


def updated(
    text: str,
    rendered: dict[str, str],
    verdicts: dict[str, dict[str, str]] | None = None,
    language: str = "en",
) -> str:
    """`text` with every block replaced by its rendering, and every verdict span by the
    goal's verdict in `language` (where `verdicts` are given)."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in rendered:
            return match.group(0)
        return f"<!-- report:{name} -->\n{rendered[name]}\n<!-- /report:{name} -->"

    def verdict(match: re.Match[str]) -> str:
        goal = match.group(1)
        if verdicts is None or goal not in verdicts:
            return match.group(0)
        return f"<!-- verdict:{goal} -->{verdicts[goal][language]}<!-- /verdict -->"

    return VERDICT.sub(verdict, BLOCK.sub(replace, text))


def main() -> None:
    parser = argparse.ArgumentParser(description=report.__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--write", action="store_true", help="update the blocks of README.md and docs/**/*.md"
    )
    action.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    args = parser.parse_args()
    try:
        rendered = render_all()
        verdicts = render_verdicts()
    except (OSError, KeyError, ValueError) as err:  # a results file missing or malformed
        sys.exit(f"report: cannot render from {report.RESULTS}: {type(err).__name__}: {err}")
    paths = {document_name(path): path for path in documents()}
    texts = {name: path.read_text(encoding="utf-8") for name, path in paths.items()}
    if args.check:
        problems = stale(texts, rendered, verdicts)
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run `python -m benchmarks.report --write`", file=sys.stderr)
            sys.exit(1)
        print("the measured tables of README.md and docs/ match benchmarks/results/")
    elif args.write:
        written = 0
        for name, text in texts.items():
            new = updated(text, rendered, verdicts, language(name))
            written += len(set(blocks(new)) & set(rendered))
            if new != text:
                paths[name].write_text(new, encoding="utf-8")
        print(f"{written} tables written into README.md and docs/")
        held = {table for text in texts.values() for table in blocks(text)}
        for name in rendered:
            if name not in held:
                print(
                    f"no document has a block for {name}: add <!-- report:{name} --> ... "
                    f"<!-- /report:{name} --> to README.md or a docs page"
                )
    else:
        for name, text in rendered.items():
            print(f"<!-- report:{name} -->\n{text}\n<!-- /report:{name} -->\n")
