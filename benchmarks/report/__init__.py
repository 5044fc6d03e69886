"""The docs' measured tables, rendered from the committed results files.

    python -m benchmarks.report            # print every table
    python -m benchmarks.report --write    # put them into README.md and docs/**/*.md
    python -m benchmarks.report --check    # exit 1 naming each table that is stale

Every table in README.md or a docs page (`docs/**/*.md`) that holds measured figures
sits between two markers (a table may appear in several of them),

    <!-- report:NAME -->
    ...
    <!-- /report:NAME -->

and is rendered by this package from `benchmarks/results/*.json` (each written by the
script that measured it): this module holds the helpers every table uses, one module per
page holds its renderers (`speed`, `cpu_inference`, `engine`, `efficient`, `analysis`,
`runs`, `verdicts` for the goals), and `pages` the markers and the command line. Each
table ends with a line naming the file, its date, machine, CPU features, torch
version, threads, load average, commit and command, and what the file does not record;
under it, a mark where the run was measured under load (`load_mark`).

The check also holds the prose to the same numbers: each results file declares what it
measures (`measures`: system, cell, harness), and a page that shows a file a newer one of
the same measurement supersedes says why (`<!-- older: NAME -->`, `older_sources`); a
goal's verdict is computed once (`verdicts`) and rendered wherever a page names it
(`<!-- verdict:NAME -->...<!-- /verdict -->`), never written by hand; a quickstart
transcript no file renders is marked as an example from a named commit and machine.
`tests/docs/test_readme_figures.py` runs the check, so a figure edited by hand, or a
results file re-measured without `--write`, fails the suite.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BLOCK = re.compile(r"<!-- report:([a-z0-9-]+) -->\n(.*?)<!-- /report:\1 -->", re.DOTALL)
# The CPU features a figure can depend on: bf16 rows need AMX or AVX512-BF16 to win.
KEY_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
# Files written before the provenance record name the machine but not its flags.
DESCRIBED_FEATURES = {
    "Intel(R) Xeon(R) Processor, 2 cores": "CPU features not in the file; README described "
    "this machine when it was measured as AVX-512, AVX-512-VNNI and AMX"
}


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


# ----- which file is the newest of a measurement ---------------------------------------


def measures(data: dict[str, Any]) -> list[dict[str, str]]:
    """What a results file measures: its `measures` records, each a system (what is
    compared), a cell (the shape, setting, threads and machine) and a harness (how)."""
    found = data.get("measures") or []
    return [found] if isinstance(found, dict) else list(found)


def measurements() -> dict[str, tuple[str, list[dict[str, str]]]]:
    """Every results file's date and `measures`, by name."""
    index = {}
    for path in sorted(RESULTS.glob("*.json")):
        data = load(path.stem)
        index[path.stem] = (data.get("date") or "", measures(data))
    return index


def superseding(name: str, index: dict | None = None) -> dict[str, list[str]]:
    """The newer files that measure what results file NAME measures (the same system in
    the same cell), each with the systems they measure again; empty if none.

    `index`: `measurements()`, when the caller asks about several files.
    """
    index = measurements() if index is None else index
    date, mine = index[name]
    ours = {(m["system"], m["cell"]) for m in mine}
    newer: dict[str, list[str]] = {}
    for other, (other_date, theirs) in index.items():
        if other == name or other_date <= date:
            continue
        again = [m["system"] for m in theirs if (m["system"], m["cell"]) in ours]
        if again:
            newer[other] = again
    return newer


# A page shows a superseded file only where it says why, in a sentence ending in this
# marker: "... the fair race did not run bf16.<!-- older: decode -->".
OLDER = re.compile(r"\S[^\n]*?<!-- older: ([A-Za-z0-9_.-]+) -->")
NAMED = re.compile(r"benchmarks/results/([A-Za-z0-9_.-]+)\.json")


def older_sources(text: str, names: list[str], index: dict | None = None) -> list[str]:
    """Each of `names` (results files a page shows) that a newer file supersedes and the
    page does not say why it shows (`OLDER`), one line each."""
    if not names:
        return []
    index = measurements() if index is None else index
    said = set(OLDER.findall(text))
    problems = []
    for name in dict.fromkeys(names):
        if name in said or name not in index:
            continue
        newer = superseding(name, index)
        if newer:
            by = ", ".join(
                f"benchmarks/results/{n}.json ({'; '.join(s)})" for n, s in newer.items()
            )
            problems.append(
                f"benchmarks/results/{name}.json is superseded by {by}: show the newer file, "
                f"or say on the page why the older one is shown, ending with <!-- older: {name} -->"
            )
    return problems


def number(value: float) -> str:
    """1,234 / 123 / 12.3 / 1.23: three significant figures at most, thousands grouped."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ratio(value: float | None, mark: str = "") -> str:
    return "" if value is None else f"{value:.2f}x{mark}"


def table(headers: list[str], rows: list[list[str]], left: int = 2) -> str:
    lines = ["| " + " | ".join(headers) + " |"]
    lines.append("|" + "|".join("---" if i < left else "---:" for i in range(len(headers))) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def per_round_ratio(slower: list[float], faster: list[float]) -> float:
    """The median over rounds of slower / faster (> 1: `faster` is faster)."""
    return statistics.median(a / b for a, b in zip(slower, faster, strict=True))


def recorded_commit(data: dict[str, Any]) -> str | None:
    """The commit a results file names (bench_positions keeps it under "library")."""
    return data.get("commit") or data.get("library", {}).get("commit")


def load_mark(data: dict[str, Any], needs_quiet: bool = False) -> str | None:
    """The mark of figures measured under load, or None.

    A results file's `load` record (benchmarks/common.py, `load_record`) says whether other
    work beside the run kept the load average above 0.75 per core; such a file is marked
    wherever it is shown. A table of absolute latencies or throughputs measured one system at a time
    (`needs_quiet`: serve, generate) is marked also when its file records no quiet load.
    A file older than the `load` record is marked when the load average it kept from its
    end, less its own threads, was above the same limit.
    """
    load = data.get("load")
    if load and load.get("noisy"):
        return (
            f"**Measured under load:** load average {load['before'][0]:g} before and "
            f"{load['after'][0]:g} after the timed part ({load['threads'] or 0} thread(s) of "
            f"its own), above {load['limit']:g} for {load['cores']} cores; the figures may be "
            "lower than on a quiet machine."
        )
    end, cores = data.get("load_average"), re.search(r"(\d+) cores", data.get("machine", ""))
    threads = data.get("args", {}).get("threads", data.get("threads"))
    if not load and end and cores and threads is not None:  # own threads known
        own, limit = int(str(threads).split(",")[0]), 0.75 * int(cores.group(1))
        if end[0] - own > limit:
            return (
                f"**Measured under load:** load average {end[0]:g} at its end ({own} "
                f"thread(s) of its own), above {limit:g} for {cores.group(1)} cores; the file "
                "has no record from before its timed part, and the figures may be lower than "
                "on a quiet machine."
            )
    if needs_quiet and not (load and load.get("noisy") is False):
        end = data.get("load_average")
        at_end = f" ({end[0]:g} at its end, its own threads included)" if end else ""
        return (
            f"**Load not recorded** before the timed part{at_end}: these figures are not "
            "known to come from a quiet machine."
        )
    return None


def source(
    name: str,
    data: dict[str, Any] | None = None,
    record: str | None = None,
    needs_quiet: bool = False,
    timed: bool = True,
) -> str:
    """One line: where a table's figures come from, and what that file does not record;
    then, on a line of its own, `load_mark`'s mark where there is one.

    `record`: the key of the file's sub-record the table comes from, if not the whole file.
    `needs_quiet`: the table's figures need a quiet machine (see `load_mark`).
    `timed`: False for a table of scores (BLEU), which the load cannot move: no mark.
    """
    data = load(name) if data is None else data
    said = [f"`benchmarks/results/{name}.json`" + (f" record `{record}`" if record else "")]
    missing = []
    said.append(data.get("date", "no date"))
    said.append(f'"{data["machine"]}"' if "machine" in data else "machine not recorded")
    if "gpu" in data:
        said.append(data["gpu"])
    if "cpu_flags" in data:
        flags = [f for f in KEY_FLAGS if f in data["cpu_flags"]]
        absent = [f for f in ("avx512f", "avx512_bf16", "amx_tile") if f not in data["cpu_flags"]]
        said.append(
            "CPU features "
            + (", ".join(flags) or "none of " + ", ".join(KEY_FLAGS))
            + (f" (no {', no '.join(absent)})" if absent else "")
        )
    elif data.get("machine") in DESCRIBED_FEATURES:
        said.append(DESCRIBED_FEATURES[data["machine"]])
    else:
        missing.append("CPU flags")
    torch_version = data.get("versions", {}).get("torch")
    said.append(f"torch {torch_version}" if torch_version else "torch version not recorded")
    threads = data.get("args", {}).get("threads", data.get("threads"))
    if threads is not None:
        said.append(f"{threads} thread{'s' if str(threads) != '1' else ''}")
    run_load, load_average = data.get("load"), data.get("load_average")
    if run_load and run_load.get("before") and run_load.get("after"):
        said.append(
            f"load average {run_load['before'][0]:g} before and {run_load['after'][0]:g} "
            "after its timed part"
        )
    elif load_average:
        said.append(f"load average {load_average[0]:g} at its end")
    commit = recorded_commit(data)
    if commit:
        said.append(f"commit `{commit}`")
    else:
        missing.append("commit")
    if data.get("command"):
        said.append(f"`{data['command']}`")
    else:
        missing.append("command")
    line = "Source: " + "; ".join(said) + "."
    if data.get("file_note"):  # how the file came to its name or form, in its own words
        line += f" The file's note: {data['file_note'].rstrip('.')}."
    if missing:
        line += (
            " This file predates the provenance record and does not say its "
            + ", ".join(missing)
            + "."
        )
    mark = load_mark(data, needs_quiet) if timed else None
    return line if mark is None else f"{line}\n\n{mark}"


def span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return ratio(low) if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}x to {high:.2f}x"


def median_range(values: list[float]) -> str:
    """The median, then the lowest and the highest: 21.50 (19.25-24.00)."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


# The documents and the names other scripts use (release.py, record_valid.py), imported
# after the helpers above: each page's module (speed, cpu_inference, engine, efficient,
# analysis, runs, verdicts) reads them as `report.load`, `report.RESULTS`, ..., so that a
# test may replace one here.
from benchmarks.report.pages import (  # noqa: E402, F401
    TABLES,
    WHEN,
    blocks,
    document_name,
    documents,
    main,
    render_all,
    stale,
    updated,
)
from benchmarks.report.runs import (  # noqa: E402, F401
    group_label,
    has_quickstart_runs,
    median_span,
    quickstart,
    quickstart_reference,
    train_profile,
    valid_bleu,
    valid_runs,
)
