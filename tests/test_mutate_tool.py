"""The mutation tool (tools/mutate.py) finds the one-token changes it promises, applies exactly one, reads the
equivalence marks beside the lines, samples deterministically and reports a missing target instead of failing.
Nothing is run against the tests here (`make mutate` does that)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "mutate.py"

SOURCE = '''\
"""A module docstring with 1 number."""

__all__ = ["f"]


def f(x: list[int], n: int = 3) -> int | None:
    if x[-1] < n and not x:
        return x[0] * 2
    if device.type == "cuda":
        n += 1
    return None
'''


@pytest.fixture(scope="module")
def mutate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutate_tool", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutate_tool"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_kind_of_one_token_change_is_found_outside_annotations_docstrings_and_exports(
    mutate: ModuleType,
) -> None:
    found = {(m.line, m.kind, m.change, m.cuda_only) for m in mutate.file_mutants("m.py", "t", SOURCE)}
    assert found == {
        (6, "constant", "3 -> 4", False),  # the default; the annotation's `int | None` is left alone
        (6, "constant", "3 -> 2", False),
        (7, "boolean", "and -> or", False),
        (7, "index", "-x -> x", False),
        (7, "index", "1 -> 2", False),
        (7, "index", "1 -> 0", False),
        (7, "compare", "< -> <=", False),
        (7, "compare", "< -> >=", False),
        (7, "unary", "not x -> x", False),
        (8, "return", "return x -> return None", False),
        (8, "arithmetic", "* -> /", False),
        (8, "index", "0 -> 1", False),
        (8, "index", "0 -> -1", False),
        (8, "constant", "2 -> 3", False),
        (8, "constant", "2 -> 1", False),
        (9, "compare", "== -> !=", False),
        (10, "arithmetic", "+= -> -=", True),
        (10, "constant", "1 -> 2", True),
        (10, "constant", "1 -> 0", True),
    }


def test_a_mutant_changes_exactly_its_token(mutate: ModuleType) -> None:
    by_change = {m.change: m for m in mutate.file_mutants("m.py", "t", SOURCE)}
    original = ast.unparse(ast.parse(SOURCE)).splitlines()
    for change, wanted in (
        ("-x -> x", "    if x[1] < n and (not x):"),
        ("not x -> x", "    if x[-1] < n and x:"),
        ("return x -> return None", "        return None"),
        ("* -> /", "        return x[0] / 2"),
    ):
        mutated = mutate.mutated_source(by_change[change], SOURCE).splitlines()
        differing = [(a, b) for a, b in zip(original, mutated, strict=True) if a != b]
        assert [b for _, b in differing] == [wanted], change


def test_equivalence_marks_apply_to_their_line_or_the_line_below_their_comment_block(mutate: ModuleType) -> None:
    source = (
        "a = 1  # equivalent mutant `1 -> 2`: beside\n"
        "# equivalent mutant `+ -> -`: above\n"
        "# and `* -> /` is only mentioned here, not marked\n"
        "b = a + 1\n"
        "# equivalent mutant `1 -> 0`: a blank line ends the block\n"
        "\n"
        "c = 1\n"
        "d = [1][0] + [1][0]  # equivalent mutant `0 -> 1` (occurrence 2): the second index only\n"
    )
    marks = mutate.equivalent_marks(source)
    assert marks == {1: {"1 -> 2"}, 4: {"+ -> -"}, 8: {"0 -> 1#2"}}
    marked = [(m.change, m.occurrence) for m in mutate.file_mutants("m.py", "t", source) if mutate._is_marked(m, marks)]
    assert marked == [("1 -> 2", 1), ("+ -> -", 1), ("0 -> 1", 2)]


def test_the_sample_is_drawn_per_target_and_fixed_by_the_seed(mutate: ModuleType) -> None:
    found = {"a": mutate.file_mutants("a.py", "a", SOURCE), "b": mutate.file_mutants("b.py", "b", SOURCE)}
    first = [m.id for m in mutate.sample(found, 5, seed=1)]
    assert first == [m.id for m in mutate.sample(found, 5, seed=1)]
    assert first != [m.id for m in mutate.sample(found, 5, seed=2)]
    assert sum(i.startswith("a.py") for i in first) == 5 and len(first) == 10
    assert len(mutate.sample(found, 0, seed=1)) == 2 * len(found["a"])


def test_a_missing_target_path_is_reported_and_skipped(mutate: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        mutate.TARGETS, "moved", (("src/hookscope/callbacks/_steps.py", "src/hookscope/gone.py"), ("tests/watch",))
    )
    monkeypatch.setitem(mutate.TARGETS, "untested", (("src/hookscope/callbacks/_steps.py",), ("tests/gone",)))
    mutants, missing = mutate.all_mutants(["moved", "untested"])
    assert missing == [
        "src/hookscope/gone.py (target 'moved'): not found, skipped",
        "tests/gone (target 'untested'): not found, skipped",
    ]
    assert set(mutants) == {"moved"} and {m.path for m in mutants["moved"]} == {"src/hookscope/callbacks/_steps.py"}


def test_the_targets_exist_in_this_tree(mutate: ModuleType) -> None:
    """A module that moved leaves the tool's table behind: the run would skip it (and say so); keep TARGETS current."""
    _, missing = mutate.all_mutants(list(mutate.TARGETS))
    assert missing == [], "update TARGETS at the top of tools/mutate.py"
