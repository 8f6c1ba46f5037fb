"""The loading convention, written once: `X.load(path)` called on a class reads a file and returns a new `X`; called
on an object it restores the file into that object, in place, as the first releases' `load` did (the same as
`hookscope.load_state(path, obj)` and `obj.load_state_dict(state)`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["class_loader"]

S = TypeVar("S")
PathLike = str | os.PathLike[str]


class class_loader:
    """Decorate `build(cls, path) -> a new cls` to make it `cls.load(path)`; on an instance, an in-place restore."""

    def __init__(self, build: Callable[[Any, PathLike], Any]) -> None:
        self._build = build
        self.__doc__ = build.__doc__
        self._name = build.__name__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    def __get__(self, instance: object, owner: type[S]) -> Callable[[PathLike], S]:
        build, name = self._build, self._name
        if instance is not None:
            return _into(instance)

        def load(path: PathLike) -> S:
            return build(owner, path)  # type: ignore[no-any-return]

        load.__doc__, load.__name__, load.__qualname__ = self.__doc__, name, f"{owner.__name__}.{name}"
        return load


def _into(instance: Any) -> Callable[[PathLike], Any]:
    def load(path: PathLike) -> None:
        """Restore the state `save(path)` wrote into this object, in place (all or nothing)."""
        from .checkpoint import load_state  # checkpoint imports the classes that use this module

        load_state(path, instance)

    return load
