"""The arrows of docs/architecture.md: `schema` imports nothing of ours, `producers` never
imports `worker`, and no module imports itself through others (type-only and
function-level imports count: a circle dodged at run time is still a circle)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Final

ROOT = Path(__file__).resolve().parents[2]
PACKAGES: Final = {
    "schema": "contextlog.schema",
    "producers": "contextlog.producers",
    "worker": "contextlog.worker",
}


def modules() -> dict[str, Path]:
    """Every module of ours by its import name."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [
                p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"
            ]
            found[".".join([package, *parts])] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The modules of ours `name` imports (a submodule named in `from pkg import sub` is
    that submodule, not its package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            subs = [f"{base}.{a.name}" for a in node.names]
            targets = [s for s in subs if s in known] or [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imported(name, path, known)) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_through_others() -> None:
    assert circles(graph()) == []


def test_the_contract_and_the_adapters_package_point_inwards_only() -> None:
    edges = graph()
    outward = [
        (a, b)
        for a, targets in edges.items()
        for b in targets
        if (a.startswith("contextlog.schema") and not b.startswith("contextlog.schema"))
        or (a.startswith("contextlog.producers") and b.startswith("contextlog.worker"))
    ]
    assert outward == []


def test_a_circle_is_found() -> None:
    # The check itself: a circle of three, and a chain that is none.
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
