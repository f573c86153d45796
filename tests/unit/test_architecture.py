"""The house's shape, checked from the code's own imports (grimp, the graph import-linter reads;
import-linter's contracts in pyproject.toml check the layers): no import circle at all."""

from __future__ import annotations

import pytest

grimp = pytest.importorskip("grimp")

ALLOWED: list[list[str]] = []  # no circle at all


def circles(graph) -> list[list[str]]:
    """Modules that import each other, directly or around a loop (Tarjan's strongly connected
    components of more than one module), function-local and TYPE_CHECKING imports included."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while (top := stack.pop()) != module:
                component.append(top)
            if component:
                found.append(sorted([module, *component]))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return sorted(found)


def test_at_most_the_one_type_only_circle():
    assert circles(grimp.build_graph("edgespec", "tui")) == ALLOWED


def test_the_circle_finder_finds_a_loop():
    class Graph:
        modules = {"a", "b", "c", "d"}
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}

        def find_modules_directly_imported_by(self, module):
            return self.edges.get(module, set())

    assert circles(Graph()) == [["a", "b", "c"]]
