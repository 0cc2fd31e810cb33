"""The floors of ``pyqueue/`` (DESIGN §18), held against its imports.

Every module belongs to one floor; a module may import from its own floor and the
floors below it, never from a floor above, and no modules may import each other in a
circle. Every import counts: at the top of a module, under ``if TYPE_CHECKING:``, and
inside a function. The graph is read from the source with :mod:`ast` (nothing is
imported), so a circle that Python tolerates at run time still fails here.

Why not import-linter's ``layers`` contract: it checks the floors but not circles
among the modules of one floor (the worker's and the task layer's parts), which is
where this package's circles were; a walk over ``ast`` does both in a screenful, and
needs no package beyond the standard library.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pyqueue"

#: The floors, bottom up: (floor, the packages and modules on it). README's "Layout"
#: is this table in words.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("protocol", ("pyqueue.protocol",)),
    ("drivers", ("pyqueue.drivers",)),
    ("aio", ("pyqueue.aio",)),
    ("ops", ("pyqueue.ops",)),
    ("worker", ("pyqueue.worker",)),
    ("tasks", ("pyqueue.tasks",)),
    ("faces", ("pyqueue.cli", "pyqueue.dashboard", "pyqueue.contrib", "pyqueue.demo")),
    ("entry", ("pyqueue", "pyqueue.__main__")),
)

#: The most modules the top of the package may hold (``pyqueue/*.py``).
MAX_TOP_LEVEL_MODULES = 10


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(path: Path, name: str, known: Mapping[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of a module of the package in ``path``, wherever
    it stands. ``from a import b`` names module ``a.b`` if there is one, else ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield node.lineno, sub if sub in known else base


def floor_of(module: str, floors: tuple[tuple[str, tuple[str, ...]], ...]) -> int:
    """The index of ``module``'s floor: that of the longest entry it is or lies under."""
    best, best_length = -1, -1
    for index, (_, members) in enumerate(floors):
        for member in members:
            if (module == member or module.startswith(member + ".")) and len(member) > best_length:
                best, best_length = index, len(member)
    return best


def graph(root: Path) -> tuple[dict[str, Path], dict[str, set[str]], list[tuple[str, int, str]]]:
    """The package's modules, its import graph (module -> modules of the package it
    imports) and each import with its line: (importer, line, imported)."""
    known = modules(root)
    edges: dict[str, set[str]] = {name: set() for name in known}
    lines = []
    for name, path in known.items():
        for line, target in imports(path, name, known):
            if target in known and target != name:
                edges[name].add(target)
                lines.append((name, line, target))
    return known, edges, lines


def upward(root: Path, floors: tuple[tuple[str, tuple[str, ...]], ...] = FLOORS) -> list[str]:
    """Every import that runs up the floors, and every module on no floor."""
    known, _, lines = graph(root)
    found = [f"{name} is on no floor: add it to FLOORS" for name in known if floor_of(name, floors) < 0]
    for importer, line, target in lines:
        if floor_of(target, floors) > floor_of(importer, floors):
            found.append(
                f"{known[importer].relative_to(root.parent)}:{line}: {importer} "
                f"({floors[floor_of(importer, floors)][0]}) imports {target} "
                f"({floors[floor_of(target, floors)][0]}, a floor above)"
            )
    return found


def circles(root: Path) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm)."""
    _, edges, _ = graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_runs_up_the_floors() -> None:
    assert upward(PACKAGE) == []


def test_no_modules_import_each_other_in_a_circle() -> None:
    found = circles(PACKAGE)
    assert found == [], "import circles (TYPE_CHECKING and function-local imports count):\n" + "\n".join(
        " <-> ".join(part) for part in found
    )


def test_the_top_of_the_package_holds_a_handful_of_modules() -> None:
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


@pytest.mark.parametrize("where", ["top", "type_checking", "function"])
def test_the_checks_fail_on_a_planted_upward_import_and_circle(tmp_path: Path, where: str) -> None:
    """The checks can fail: a copy of a small package with an import planted upward
    (at the top, under TYPE_CHECKING, in a function) is refused, and so is a circle."""
    root = tmp_path / "pyqueue"
    (root / "protocol").mkdir(parents=True)
    (root / "worker").mkdir()
    for init in (root, root / "protocol", root / "worker"):
        (init / "__init__.py").write_text("")
    (root / "worker" / "loop.py").write_text("from pyqueue.protocol.models import Job\n")
    planted = {
        "top": "from pyqueue.worker.loop import run\n",
        "type_checking": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pyqueue.worker.loop import run\n",
        "function": "def job():\n    from pyqueue.worker import loop\n    return loop\n",
    }[where]
    (root / "protocol" / "models.py").write_text("class Job: ...\n" + planted)
    floors = (("protocol", ("pyqueue.protocol",)), ("worker", ("pyqueue.worker",)), ("entry", ("pyqueue",)))
    found = upward(root, floors)
    assert len(found) == 1 and "pyqueue.protocol.models (protocol) imports pyqueue.worker.loop" in found[0], found
    assert circles(root) == [["pyqueue.protocol.models", "pyqueue.worker.loop"]]
