"""Record a quickstart run for the docs' seed table (docs/explanation/results/quickstart.md) and the packaged reference line.

    aiayn quickstart --out runs/qs-seed0 --minutes 15 --seed 0
    python -m benchmarks.record_quickstart runs/qs-seed0 --name quickstart-seed0-15min
    python -m benchmarks.report --write     # the docs' quickstart table
    python -m benchmarks.release            # at a release: the packaged reference line

It writes `benchmarks/results/NAME.json`, and nothing under `src/`: the run's results.json
under "results", with the provenance of every results file (machine, CPU flags, versions,
commit) and, as "command", the `aiayn quickstart` line that repeats the run (rebuilt
from results.json unless `--command` gives it). Its date is the run's own
(results.json's); no load average is recorded, as the load now is not the one the run
trained under. Record from the checkout that ran it, right after the run: the commit and
the machine are read now.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from benchmarks import common

NAME_PREFIX = "quickstart-"


def measured(results: dict[str, Any]) -> dict[str, str]:
    """The file's `measures` record (the report's system, cell and harness) for a run."""
    version = (results.get("recipe_sha256") or "")[:8] or "not recorded"
    cell = f"{Path(results['recipe']).name} version {version}, {results['minutes']:g} minutes"
    cell += f", seed {results['seed']}, {results['device']}"
    cell += "".join(f", {override}" for override in results.get("overrides", []))
    return {
        "system": "aiayn quickstart: test BLEU and chrF after training",
        "cell": cell,
        "harness": "record_quickstart",
    }


def quickstart_command(results: dict[str, Any]) -> str:
    """The `aiayn quickstart` line that made a run, from its results.json."""
    args = ["aiayn", "quickstart", "--minutes", f"{results['minutes']:g}"]
    args += ["--seed", str(results["seed"]), "--device", results["device"]]
    recipe = Path(results["recipe"]).name
    if recipe != "bible-en-es-cpu.yaml" or results["device"].startswith("cuda"):
        args += ["--recipe", recipe]
    for override in results.get("overrides", []):
        args += ["--set", override]
    for option, key, default in (
        ("--vocab-size", "vocab_size", 8000),
        ("--average", "average_last", 1),
        ("--beam", "beam", 8),
        ("--alpha", "alpha", 1.0),
    ):
        if key in results and results[key] != default:
            args += [option, f"{results[key]:g}"]
    return shlex.join(args)


def record(run_out: Path, name: str, command: str | None = None) -> Path:
    """Write RESULTS/NAME.json from RUN_OUT/results.json (see the module docstring).

    Raises:
        FileNotFoundError: RUN_OUT has no results.json.
        ValueError: NAME does not start with "quickstart-", or results.json lacks
            the seed or the minutes (written before `--seed`).
    """
    if not name.startswith(NAME_PREFIX):
        raise ValueError(f"--name {name!r} must start with {NAME_PREFIX!r} (report.py reads those)")
    path = run_out / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no results.json; give the quickstart's --out directory")
    results = json.loads(path.read_text(encoding="utf-8"))
    missing = [key for key in ("seed", "minutes", "bleu") if key not in results]
    if missing:
        raise ValueError(f"{path} has no {', '.join(missing)}: rerun it with this version")
    data = {**common.provenance(), "command": command or quickstart_command(results)}
    data["measures"] = [measured(results)]
    # The run ended before this script started: its date is the run's own, and the load
    # now says nothing of the load it ran under.
    del data["date"], data["load_average"], data["load"]
    if "date" in results:
        data["date"] = results["date"]
    data["results"] = results
    common.RESULTS.mkdir(parents=True, exist_ok=True)
    written = common.RESULTS / f"{name}.json"
    written.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_out", type=Path, help="the quickstart's --out directory")
    parser.add_argument("--name", required=True, help="e.g. quickstart-seed0-15min")
    parser.add_argument("--command", help="the command that ran it (default: rebuilt)")
    args = parser.parse_args()
    try:
        written = record(args.run_out, args.name, args.command)
    except (OSError, ValueError) as err:
        sys.exit(f"record_quickstart.py: {err}")
    print(f"wrote {written}; now run: python -m benchmarks.report --write")


if __name__ == "__main__":
    main()
