"""The portability audit (issue 41): the training tests under 3 seeds and 2 kernel sets.

    python tests/variants/audit.py [--seeds 0 1 2] [--out audit.md] [pytest args ...]

Runs pytest once per (kernel set, seed shift) on the tests marked `trains` (or on the
pytest arguments given), each run in its own process, one after the other, and prints a
table: one row per test, one column per variant, pass or FAIL. The kernel sets are this
CPU's own ("native") and another CPU's ("other", tests/variants/kernels.py): PyTorch's
and oneDNN's kernels of another SIMD width, other summation orders, as on another CPU. A seed
shift k runs every seed a test sets as seed + k (tests/variants/sitecustomize.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from kernels import other_kernels

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = Path(__file__).resolve().parent
KERNELS = {"native": {}, "other": other_kernels()}


def run_variant(kernels: str, shift: int, pytest_args: list[str], junit: Path) -> None:
    env = {**os.environ, **KERNELS[kernels], "AIAYN_SEED_SHIFT": str(shift)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(VARIANTS), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    subprocess.run([*command, f"--junitxml={junit}", *pytest_args], cwd=ROOT, env=env)


def outcomes(junit: Path) -> dict[str, str]:
    results = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        results[name] = "FAIL" if failed else "skip" if skipped else "pass"
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    args, pytest_args = parser.parse_known_args()
    pytest_args = pytest_args or ["-m", "trains", "-n", "2"]
    columns: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kernels in args.kernels:
            for shift in args.seeds:
                junit = Path(tmp) / f"{kernels}-{shift}.xml"
                run_variant(kernels, shift, pytest_args, junit)
                columns[f"{kernels}, seed +{shift}"] = outcomes(junit) if junit.exists() else {}
    tests = sorted({name for column in columns.values() for name in column})
    lines = ["| test | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for test in tests:
        cells = [columns[c].get(test, "-") for c in columns]
        lines.append(f"| {test} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n", encoding="utf-8")
    failed = any("FAIL" in column.values() for column in columns.values())
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
