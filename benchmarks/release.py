"""The release step: the packaged quickstart reference, regenerated from the committed results.

    python -m benchmarks.release           # write src/aiayn/config/recipes/quickstart-reference.json
    python -m benchmarks.release --check   # exit 1 if that file differs from the results
    make release-reference                 # the first line

`aiayn quickstart` prints a reference line next to its BLEU (`aiayn.apps.quickstart.
reference_line`) from a file shipped inside the package. That file is rendered
(`report.quickstart_reference`) from `benchmarks/results/quickstart-*.json`, which
`record_quickstart` writes; no benchmark writes into `src/`: only this step does, when
newly recorded runs are taken into a release. `tests/docs/test_quickstart_reference.py`
fails while the packaged file differs from what this step would write.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks import report

ROOT = report.ROOT
REFERENCE = ROOT / "src" / "aiayn" / "config" / "recipes" / "quickstart-reference.json"


def reference_text() -> str:
    """The packaged reference file's text, rendered from the recorded quickstart runs.

    Raises:
        OSError, KeyError, ValueError: a results file is unreadable or malformed.
    """
    return json.dumps(report.quickstart_reference(), indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Write the packaged reference (or, with --check, exit 1 naming it if it is stale)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    name = REFERENCE.relative_to(ROOT) if REFERENCE.is_relative_to(ROOT) else REFERENCE
    try:
        text = reference_text()
    except (OSError, KeyError, ValueError) as err:  # a results file missing or malformed
        sys.exit(f"release: cannot render from {report.RESULTS}: {type(err).__name__}: {err}")
    current = REFERENCE.is_file() and REFERENCE.read_text(encoding="utf-8") == text
    if args.check and not current:
        sys.exit(
            f"{name} differs from benchmarks/results/quickstart-*.json: "
            "run `python -m benchmarks.release`"
        )
    if not current:
        REFERENCE.write_text(text, encoding="utf-8")
    print(f"{name}: {'matches' if current else 'written from'} benchmarks/results/")


if __name__ == "__main__":
    main()
