"""The documents: which table each marker names, rendering them all, and the
`--write` / `--check` command line."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks import report
from benchmarks.report import BLOCK
from benchmarks.report.analysis import (
    alignment,
    export,
    hooks,
    induction,
    positions_bible,
    positions_extrapolation,
    pruning,
    shapes,
)
from benchmarks.report.cpu_inference import int8_kernels, memory, quality, quality_seeds
from benchmarks.report.efficient import (
    attention,
    efficient_attention,
    efficient_task,
    sdpa_backends,
    sliding_window,
)
from benchmarks.report.engine import generate, generate_engine, serve, step_overhead, translate_file
from benchmarks.report.runs import (
    has_quickstart_runs,
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
from benchmarks.report.verdicts import goals

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
    "generate-engine": generate_engine,
    "step-overhead": step_overhead,
    "gpu-decode": gpu_decode,
    "efficient-listops": lambda: efficient_task("efficient-listops"),
    "efficient-bible-genre": lambda: efficient_task("efficient-bible-genre"),
    "efficient-charlm": lambda: efficient_task("efficient-charlm"),
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
    "valid-searches": valid_searches,
    "induction": induction,
    "alignment": alignment,
    "export": export,
    "hooks": hooks,
    "memory": memory,
    "int8-kernels": int8_kernels,
    "train-profile-bf16": lambda: train_profile("train-profile-bf16"),
}


def recorded(name: str) -> Callable[[], bool]:
    """Whether RESULTS/NAME.json exists, asked when the tables are rendered."""
    return lambda: (report.RESULTS / f"{name}.json").exists()


# Tables rendered only once their results exist (README gains their blocks with them).
WHEN = {
    "decode-cells": has_cells,
    "decode-fair-cells": lambda: has_cells("decode-fair"),
    "decode-memory": has_cells,
    "quickstart": has_quickstart_runs,
    "train-profile": recorded("train-profile"),
    "quality": recorded("quality"),
    "quality-seeds": recorded("quality-seeds"),
    "valid-variants": recorded("valid-sweep"),
    "valid-searches": recorded("valid-sweep"),
    "induction": recorded("induction"),
    "alignment": recorded("alignment"),
    "export": recorded("export"),
    "hooks": recorded("hooks"),
    "memory": recorded("memory"),
    "int8-kernels": recorded("int8-kernels"),
    "efficient-attention": lambda: "efficient" in report.load("attention"),
    "train-profile-bf16": recorded("train-profile-bf16"),
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
    "generate-engine": recorded("generate-engine"),
    "step-overhead": recorded("step-overhead"),
    "gpu-decode": recorded("decode-gpu-b256"),
    "efficient-listops": recorded("efficient-listops"),
    "efficient-bible-genre": recorded("efficient-bible-genre"),
    "efficient-charlm": recorded("efficient-charlm"),
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


def stale(texts: dict[str, str], rendered: dict[str, str]) -> list[str]:
    """Each problem with the documents' blocks, one line each (empty: all up to date).

    Args:
        texts: each document's name (README.md, docs/...) and its text.
        rendered: each table's name and its rendering (`render_all`).

    Returns:
        A table that no document holds; per document, a block that names no table, or
        one that differs from its rendering.
    """
    found = {name: blocks(text) for name, text in texts.items()}
    held = {table for tables in found.values() for table in tables}
    problems = [
        f"{table}: no <!-- report:{table} --> block in README.md or docs/"
        for table in rendered
        if table not in held
    ]
    for name, tables in found.items():
        problems += [
            f"{name}: {table}: no such table in report.py"
            for table in tables
            if table not in rendered
        ]
        problems += [
            f"{name}: {table}: differs from what report.py renders from the results files"
            for table in rendered
            if table in tables and tables[table] != rendered[table] + "\n"
        ]
    return problems


def updated(text: str, rendered: dict[str, str]) -> str:
    """`text` with every block replaced by its rendering."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in rendered:
            return match.group(0)
        return f"<!-- report:{name} -->\n{rendered[name]}\n<!-- /report:{name} -->"

    return BLOCK.sub(replace, text)


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
    except (OSError, KeyError, ValueError) as err:  # a results file missing or malformed
        sys.exit(f"report.py: cannot render from {report.RESULTS}: {type(err).__name__}: {err}")
    paths = {document_name(path): path for path in documents()}
    texts = {name: path.read_text(encoding="utf-8") for name, path in paths.items()}
    if args.check:
        problems = stale(texts, rendered)
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run `python -m benchmarks.report --write`", file=sys.stderr)
            sys.exit(1)
        print("the measured tables of README.md and docs/ match benchmarks/results/")
    elif args.write:
        written = 0
        for name, text in texts.items():
            new = updated(text, rendered)
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
