"""The top level: `hookscope.__all__` is the documented list, and every name that left it still imports, with a
FutureWarning naming its new home, as the same object its subpackage exports."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import hookscope

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "hookscope.md"
BEFORE = 79  # top-level names before the trim (0.1)


def _tables() -> tuple[list[str], dict[str, str]]:
    """The names of the page's first table, and `name -> home` of its second (moved names)."""
    tables = PAGE.read_text(encoding="utf-8").split("\n\n")
    rows = [[line for line in t.splitlines() if line.startswith("| ") and "---" not in line][1:] for t in tables]
    rows = [r for r in rows if r]
    kept = [name for row in rows[0] for name in re.findall(r"`([\w]+)`", row.split("|")[2])]
    moved = {}
    for row in rows[1]:
        home, names = row.split("|")[1:3]
        for name in re.findall(r"`(\w+)`", names):
            moved[name] = home.strip().strip("`")
    return kept, moved


def test_all_is_the_documented_list() -> None:
    kept, moved = _tables()
    assert sorted(kept) == sorted(hookscope.__all__) and len(kept) == len(set(kept))
    assert moved == hookscope.MOVED
    assert len(hookscope.__all__) + len(hookscope.MOVED) == BEFORE  # nothing was dropped, only moved


def test_dir_lists_the_kept_names_and_subpackages_only() -> None:
    listed = set(dir(hookscope))
    assert set(hookscope.__all__) <= listed and not listed & set(hookscope.MOVED)
    assert listed == set(hookscope.__all__) | set(hookscope.SUBPACKAGES)
    for name in hookscope.__all__:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            getattr(hookscope, name)  # kept names never warn


@pytest.mark.parametrize("name", sorted(hookscope.MOVED))
def test_a_moved_name_warns_and_is_its_subpackages_object(name: str) -> None:
    home = hookscope.MOVED[name]
    assert name in importlib.import_module(home).__all__
    with pytest.warns(FutureWarning, match=rf"hookscope\.{name} moved to {home}: use `from {home} import {name}`"):
        value = getattr(hookscope, name)
    assert value is getattr(importlib.import_module(home), name)
    with pytest.warns(FutureWarning, match=f"from {home} import {name}"):
        exec(f"from hookscope import {name} as imported", namespace := {})
    assert namespace["imported"] is value


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'hookscope' has no attribute 'no_such_name'"):
        hookscope.no_such_name  # type: ignore[attr-defined]  # noqa: B018
