"""The top level: `hookscope.__all__` is the documented list, and every name the seed had at the top level that lives
in a subpackage now still imports from `hookscope`, without a warning, as the same object its subpackage exports."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import hookscope

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "hookscope.md"
BEFORE = 78  # the seed's top-level names (its __all__), all still importable from hookscope


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
    assert moved == hookscope.ELSEWHERE
    assert len(hookscope.__all__) + len(hookscope.ELSEWHERE) == BEFORE  # nothing the seed had was dropped


def test_dir_lists_the_kept_names_and_subpackages_only() -> None:
    listed = set(dir(hookscope))
    assert set(hookscope.__all__) <= listed and not listed & set(hookscope.ELSEWHERE)
    assert listed == set(hookscope.__all__) | set(hookscope.SUBPACKAGES)
    for name in hookscope.__all__:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            getattr(hookscope, name)  # kept names never warn


@pytest.mark.parametrize("name", sorted(hookscope.ELSEWHERE))
def test_a_seed_name_imports_without_a_warning_as_its_subpackages_object(name: str) -> None:
    home = hookscope.ELSEWHERE[name]
    assert name in importlib.import_module(home).__all__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = getattr(hookscope, name)
        exec(f"from hookscope import {name} as imported", namespace := {})
    assert value is getattr(importlib.import_module(home), name) and namespace["imported"] is value


def test_a_name_no_seed_had_at_the_top_level_is_only_in_its_subpackage() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'HookFailureWarning'"):
        hookscope.HookFailureWarning  # type: ignore[attr-defined]  # noqa: B018
    assert "HookFailureWarning" in importlib.import_module("hookscope.hooks").__all__


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'hookscope' has no attribute 'no_such_name'"):
        hookscope.no_such_name  # type: ignore[attr-defined]  # noqa: B018
