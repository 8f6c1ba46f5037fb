"""`@checked` checks every annotation it is given: an annotation that names something its module defines only
for type checkers is refused (it would let any argument through), and no hookscope entry point has one."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

import hookscope
from hookscope._check import _Plan, checked
from hookscope._types import UncheckedAnnotation

if TYPE_CHECKING:
    from collections import OrderedDict


def _checked_functions() -> Iterator[tuple[str, Callable[..., Any]]]:
    seen: set[int] = set()
    for info in pkgutil.walk_packages(hookscope.__path__, "hookscope."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for obj in list(vars(module).values()):
            candidates = [obj]
            if inspect.isclass(obj):
                candidates = [value for value in vars(obj).values() if callable(value)]
            for function in candidates:
                if hasattr(function, "__hookscope_rules__") and id(function) not in seen:
                    seen.add(id(function))
                    yield f"{info.name}.{function.__qualname__}", function


def test_every_checked_entry_point_resolves_its_annotations() -> None:
    found = list(_checked_functions())
    assert len(found) > 100  # the walk sees the entry points (about 120)
    for name, function in found:
        try:
            _Plan(inspect.unwrap(function), function.__hookscope_rules__)
        except UncheckedAnnotation as err:
            pytest.fail(f"{name}: {err}")


def test_an_annotation_known_only_to_type_checkers_is_refused() -> None:
    @checked()
    def take(mapping: OrderedDict[str, int]) -> None:
        """`OrderedDict` is imported under TYPE_CHECKING only."""

    with pytest.raises(UncheckedAnnotation, match=r"names 'OrderedDict', which .* does not define at run time"):
        take(42)  # type: ignore[arg-type]


def test_a_plot_of_a_wrong_argument_explains_instead_of_failing_inside() -> None:
    pytest.importorskip("matplotlib")
    from hookscope.plot import plot_activations

    with pytest.raises(TypeError, match=r"results must be a WatchResults, got 42"):
        plot_activations(42)  # type: ignore[arg-type]
