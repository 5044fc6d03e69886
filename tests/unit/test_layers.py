"""The package's structure: imports point down the layers of pyproject.toml's
[tool.importlinter] contract, and no import circle exists, at any depth.

The graph is the one import-linter draws (grimp): every import statement, those inside
functions and under TYPE_CHECKING included, since each is a dependency a reader meets.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("aiayn", cache_dir=None)


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return circles


MAX_MODULE_LINES = 700  # issue 43: a module longer than this does more than one job
MAX_TOP_LEVEL = 12  # issue 43: entries directly under src/aiayn (__pycache__ aside)
OVER_LENGTH_FOR_NOW: set[str] = set()  # a module allowed over the bound, with its date and issue


def _long_modules(root: Path, folders: list[Path], limit: int) -> dict[str, int]:
    """Each `.py` under `folders` longer than `limit` lines -> its line count, by its
    path relative to `root`."""
    long = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            lines = len(path.read_bytes().splitlines())
            if lines > limit:
                long[path.relative_to(root).as_posix()] = lines
    return long


def _top_level(package: Path) -> list[str]:
    """What lies directly in a package folder, `__pycache__` aside."""
    return sorted(entry.name for entry in package.iterdir() if entry.name != "__pycache__")


def test_no_module_in_the_package_or_the_benchmarks_is_over_700_lines():
    folders = [ROOT / "src" / "aiayn", ROOT / "benchmarks"]
    long = _long_modules(ROOT, folders, MAX_MODULE_LINES)
    over = {path: lines for path, lines in long.items() if path not in OVER_LENGTH_FOR_NOW}
    assert over == {}, f"split these by concern, each under {MAX_MODULE_LINES} lines: {over}"


def test_the_package_top_level_holds_at_most_12_entries():
    entries = _top_level(ROOT / "src" / "aiayn")
    assert len(entries) <= MAX_TOP_LEVEL, f"{len(entries)} entries: {entries}"


def test_the_size_checks_count_lines_and_entries(tmp_path):
    (tmp_path / "pkg" / "sub" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * 700)
    (tmp_path / "pkg" / "sub" / "long.py").write_text("x = 1\n" * 701)
    (tmp_path / "pkg" / "sub" / "__pycache__" / "cached.py").write_text("x = 1\n" * 900)
    (tmp_path / "pkg" / "notes.txt").write_text("x\n" * 900)
    assert _long_modules(tmp_path, [tmp_path / "pkg"], 700) == {"pkg/sub/long.py": 701}
    (tmp_path / "pkg" / "__pycache__").mkdir()
    assert _top_level(tmp_path / "pkg") == ["notes.txt", "short.py", "sub"]


def test_imports_point_down_the_layers():
    # In a process of its own: import-linter reconfigures logging for the process it runs in.
    check = (
        "import sys; from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports({str(ROOT / 'pyproject.toml')!r}, no_cache=True, no_logo=True))"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_import_circle():
    assert _circles(_graph()) == []


def test_the_circle_finder_finds_a_circle():
    graph = _graph()
    graph.add_import(importer="aiayn.inference.kv_cache", imported="aiayn.inference.decoding")
    pair = {"aiayn.inference.decoding", "aiayn.inference.kv_cache"}
    assert any(pair <= set(c) for c in _circles(graph))


def test_every_package_module_is_in_a_layer():
    """A new top-level package must be placed in the layers, or it escapes the check."""
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in contract["contracts"] if c["type"] == "layers"]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    top = {".".join(m.split(".")[:2]) for m in _graph().modules if m.count(".") >= 1}
    unplaced = sorted(top - named - {"aiayn.__main__"})
    assert unplaced == [], f"add these to [tool.importlinter] layers: {unplaced}"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("aiayn.attention", "aiayn.nn.attention"),
        ("aiayn.model", "aiayn.models.encoder_decoder"),
        ("aiayn.nn.kv_cache", "aiayn.inference.kv_cache"),
        ("aiayn.serve.app", "aiayn.apps.serve.app"),
        ("aiayn.tasks.translation", "aiayn.training.tasks.translation"),
        ("aiayn.files", "aiayn.data.files"),
        ("aiayn.plugins", "aiayn.config.plugins"),
        ("aiayn.devices", "aiayn.config.devices"),
        ("aiayn.configs", "aiayn.config.recipes"),
    ],
)
def test_old_module_paths_are_the_new_modules_with_a_warning(old, new):
    import importlib
    import sys

    import aiayn  # noqa: F401  (installs the finder of moved modules)

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        moved = importlib.import_module(old)
    assert moved is importlib.import_module(new)
