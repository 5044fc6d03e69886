"""A MkDocs hook: the figures in `benchmarks/results/` become part of the site.

The benchmarks, the CLI and the browser test write their PNGs into
`benchmarks/results/` beside the results files (they are committed there, not copied
into docs/ by hand). Each is added to the site as `assets/results/NAME.png`, so a page
shows one as `![...](../../assets/results/NAME.png)` and `mkdocs build --strict` fails
on a figure that is not there.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def on_files(files, config):
    """MkDocs hook: add benchmarks/results/*.png under assets/results/."""
    for png in sorted(RESULTS.glob("*.png")):
        uri = f"assets/results/{png.name}"
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, abs_src_path=str(png)))
    return files
