"""The loading convention, written once: `X.load(path)` is a classmethod that reads a file and returns a new `X`;
restoring a state into an existing object is `obj.load_state_dict(state)` or `hookscope.load_state(path, obj)`.

`class_loader` makes `load` follow it: called on the class it builds a new object from the file; called on an
instance it raises a `TypeError` naming both fixes, so that `r.load(path)` never silently returns a new object
while `r` stays as it was.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["class_loader", "deprecated_load"]

S = TypeVar("S")
PathLike = str | os.PathLike[str]


class class_loader:
    """Decorate `build(cls, path) -> a new cls` to make it `cls.load(path)`; refused (TypeError) on instances."""

    def __init__(self, build: Callable[[Any, PathLike], Any]) -> None:
        self._build = build
        self.__doc__ = build.__doc__
        self._name = build.__name__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    def __get__(self, instance: object, owner: type[S]) -> Callable[[PathLike], S]:
        build, name = self._build, self._name
        if instance is not None:
            return _refused(owner.__name__, name)

        def load(path: PathLike) -> S:
            return build(owner, path)  # type: ignore[no-any-return]

        load.__doc__, load.__name__, load.__qualname__ = self.__doc__, name, f"{owner.__name__}.{name}"
        return load


def _refused(owner: str, name: str) -> Callable[[PathLike], Any]:
    variable = re.findall(r"[A-Z][a-z]*", owner)[-1:] or [owner]  # StatsReducer -> r, MonitorPool -> p
    short = variable[0][0].lower()

    def load(path: PathLike) -> Any:
        raise TypeError(
            f"{owner}.{name}(path) is a classmethod that returns a new {owner}, and would leave this one unchanged: "
            f"use {short} = {owner}.{name}(path) or hookscope.load_state(path, {short})"
        )

    return load


def deprecated_load(obj: object, short: str) -> None:
    """Warn that the in-place `obj.load(path)` (of objects that cannot be rebuilt from a file) is deprecated."""
    owner = type(obj).__name__
    warnings.warn(
        f"{owner}.load(path) is deprecated and will be removed in the next release (X.load(path) returns a new "
        f"object wherever hookscope defines it): use hookscope.load_state(path, {short}) to restore {short}",
        FutureWarning,
        stacklevel=3,
    )
