"""hookscope's packages import one way: no cycle between them, lazy imports (inside functions) and imports for
type checking included, and the readers of results (the doctor, plots, report) sit on `hookscope.results`, never
on the recorder (`hookscope.watch`).

The graph is read from the source with `ast`, so an import that runs only on some path counts as much as one at
the top of a module. A "package" is a subpackage (`hookscope.watch`) or a top-level module (`hookscope.distributed`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
ROOT = SRC / "hookscope"


def _unit(module: str) -> str:
    """The package a dotted module name belongs to: `hookscope.watch._recorder` -> `watch`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "hookscope"


def _imports(path: Path) -> Iterator[str]:
    """Every hookscope module `path` imports, anywhere in it, as dotted names."""
    relative = path.relative_to(SRC).with_suffix("")
    here = list(relative.parts[:-1])  # the package a relative import starts from, for modules and __init__ alike
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("hookscope"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if not target.startswith("hookscope"):
                continue
            if target == "hookscope":  # `from .. import checkpoint`: the names are modules or packages
                for alias in node.names:
                    named = ROOT / alias.name
                    yield f"hookscope.{alias.name}" if named.is_dir() or named.with_suffix(".py").exists() else target
            else:
                yield target


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(SRC).with_suffix("")
        source = _unit(".".join(p for p in relative.parts if p != "__init__"))
        for target in _imports(path):
            unit = _unit(target)
            if unit != source:
                edges.setdefault(source, set()).add(unit)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `edges` as a list of packages, or None (depth-first search with colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_graph_is_read() -> None:
    """The reader sees the imports it must see (so an empty graph cannot pass the tests below)."""
    edges = _graph()
    assert {"results", "hooks", "callbacks"} <= edges["watch"]
    assert "results" in edges["doctor"] and "results" in edges["report"]


def test_no_import_cycle_between_packages() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


@pytest.mark.parametrize("reader", ["doctor", "plot", "report", "results"])
def test_readers_of_results_never_import_the_recorder(reader: str) -> None:
    assert not _graph().get(reader, set()) & {"watch", "callbacks", "cli", "steer"}
