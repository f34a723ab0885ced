"""The load side's modules import one way (see ``snapshotter.loader``'s docstring): no
cycle, counting imports made only for type checking or inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import snapshotter

LOAD_SIDE = {
    "loader",
    "loader_cpu",
    "loader_ram",
    "loader_cuda",
    "pipeline",
    "load_plan",
    "load_types",
    "module_fill",
    "profile",
}


def _imports(module: str) -> set[str]:
    """Every ``snapshotter.X`` a module imports, wherever the import statement is."""
    tree = ast.parse((Path(snapshotter.__file__).parent / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    prefix = "snapshotter."
    return {name[len(prefix) :].split(".")[0] for name in found if name.startswith(prefix)}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in ``graph`` as a path that returns to its start, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_the_load_side_imports_one_way() -> None:
    graph = {m: _imports(m) & LOAD_SIDE for m in LOAD_SIDE}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
    assert graph["load_types"] == set()  # the shared types depend on nothing of the loader


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
