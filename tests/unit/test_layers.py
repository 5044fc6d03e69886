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
