"""Annotations as runtime tests and as words: what `hookscope._check.checked` checks arguments against.

`resolve(annotation, function)` turns an annotation's text (every module uses `from __future__ import
annotations`) into the type; `fits(value, annotation)` tests a value against it, items of containers included
(a test is compiled once per annotation); `describe(annotation)` says it in words for error messages.
"""

from __future__ import annotations

import builtins
import collections.abc as abc
import functools
import inspect
import os
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn as nn

__all__ = [
    "Test",
    "UncheckedAnnotation",
    "article",
    "compile_test",
    "describe",
    "fits",
    "members",
    "number",
    "resolve",
    "types_in",
]

Test = Callable[[Any], bool]


def number(value: Any) -> bool:
    """Whether `value` is an int or a float (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Lenient(dict[str, Any]):
    """Resolve names as the module does; a name the module does not define at run time (an `if TYPE_CHECKING:`
    import) is refused: `resolve` raises `UncheckedAnnotation` rather than let any argument through."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        super().__init__()
        self.namespace = namespace

    def __missing__(self, key: str) -> Any:
        if key in self.namespace:
            return self.namespace[key]
        if hasattr(builtins, key):
            return getattr(builtins, key)
        if key.startswith("__"):
            raise KeyError(key)  # frame variables such as __tracebackhide__ are not type names
        raise UncheckedAnnotation(key)


class UncheckedAnnotation(TypeError):
    """An annotation names something its module does not define at run time, so no argument can be checked
    against it (a hookscope bug: import the name at run time, or annotate the parameter with `Any`)."""


def resolve(annotation: Any, function: Callable[..., Any]) -> Any:
    """The type an annotation (or its text) names in `function`'s module.

    Raises:
        UncheckedAnnotation: the annotation names something the module defines only for type checkers.
    """
    if annotation is inspect.Parameter.empty:
        return Any
    if isinstance(annotation, str):
        namespace = getattr(function, "__globals__", {})
        try:
            return eval(annotation, namespace, _Lenient(namespace))  # our own source text
        except UncheckedAnnotation as err:
            raise UncheckedAnnotation(
                f"{function.__qualname__}: annotation {annotation!r} names {err.args[0]!r}, which "
                f"{function.__module__} does not define at run time; import it there (not under TYPE_CHECKING) "
                "or annotate the parameter with Any"
            ) from None
    return annotation


def fits(value: Any, annotation: Any) -> bool:
    """Whether `value` is of the (resolved) `annotation`'s type, items of containers included."""
    return compile_test(annotation)(value)


def compile_test(annotation: Any) -> Test:
    """The test `fits` runs for `annotation`, built once per annotation (checks run on every call)."""
    try:
        return _compiled(annotation)
    except TypeError:  # an unhashable annotation: build it each time
        return _compile(annotation)


@functools.lru_cache(maxsize=1024)
def _compiled(annotation: Any) -> Test:
    return _compile(annotation)


def _anything(value: Any) -> bool:
    return True


def _compile(annotation: Any) -> Test:
    if annotation is Any or annotation is object or isinstance(annotation, (TypeVar, typing.ForwardRef, str)):
        return _anything
    if annotation is None or annotation is type(None):
        return lambda v: v is None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        tests = [compile_test(arg) for arg in args]
        return _anything if _anything in tests else lambda v: any(test(v) for test in tests)
    if origin is typing.Literal:
        return lambda v: v in args
    if origin is typing.Annotated:
        return compile_test(args[0])
    if origin is not None:
        return _compile_generic(origin, args)
    return _SIMPLE.get(annotation) or _compile_class(annotation)


_SIMPLE: dict[Any, Test] = {
    bool: lambda v: isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: number,
}


def _compile_class(annotation: Any) -> Test:
    if not isinstance(annotation, type):
        return _anything
    if getattr(annotation, "_is_protocol", False) and not getattr(annotation, "_is_runtime_protocol", False):
        return _anything
    return lambda v: isinstance(v, annotation)


def _compile_generic(origin: Any, args: tuple[Any, ...]) -> Test:
    if origin is abc.Callable:
        return callable
    if origin is type:
        base = args[0] if args and isinstance(args[0], type) else object
        return lambda v: isinstance(v, type) and issubclass(v, base)
    if origin is tuple:
        return _compile_tuple(args)
    if origin in (dict, abc.Mapping, abc.MutableMapping):
        key, item = (compile_test(a) for a in (args if len(args) == 2 else (Any, Any)))
        return lambda v: isinstance(v, abc.Mapping) and all(key(k) and item(x) for k, x in v.items())
    if isinstance(origin, type) and issubclass(origin, os.PathLike):
        return lambda v: isinstance(v, os.PathLike)
    if not isinstance(origin, type):
        return _anything
    item = compile_test(args[0]) if args else _anything
    text = origin in (str, bytes)

    def test(v: Any) -> bool:
        if not isinstance(v, origin) or (isinstance(v, (str, bytes)) and not text):
            return False  # a str is an iterable of str, and almost always a missing [ ]
        return not isinstance(v, (list, tuple, set, frozenset)) or all(item(x) for x in v)

    return test


def _compile_tuple(args: tuple[Any, ...]) -> Test:
    if len(args) == 2 and args[1] is Ellipsis:
        item = compile_test(args[0])
        return lambda v: isinstance(v, (tuple, list)) and all(item(x) for x in v)
    tests = [compile_test(a) for a in args]
    return lambda v: (
        isinstance(v, (tuple, list))
        and (not tests or (len(v) == len(tests) and all(t(x) for t, x in zip(tests, v, strict=True))))
    )


def describe(annotation: Any) -> str:
    """The annotation in words: "an int", "a str or None", "a list of str", "an nn.Module"."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is None or annotation is type(None):
        return "None"
    if origin is typing.Union or origin is types.UnionType:
        kinds = [describe(a) for a in args if a is not type(None)]
        return " or ".join(kinds + (["None"] if type(None) in args else []))
    if origin is typing.Literal:
        return f"one of {', '.join(map(repr, args))}"
    if origin is abc.Callable:
        return "a callable"
    if origin is type:
        return article(f"{_bare(args[0])} class") if args else "a class"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a tuple of {_bare(args[0])}"
        return f"a tuple ({', '.join(_bare(a) for a in args)})" if args else "a tuple"
    if origin in (dict, abc.Mapping, abc.MutableMapping):
        return f"a mapping of {_bare(args[0])} to {_bare(args[1])}" if len(args) == 2 else "a mapping"
    if origin is not None and isinstance(origin, type) and issubclass(origin, os.PathLike):
        return "a path (str or os.PathLike)"
    if origin is not None:
        return f"a list of {_bare(args[0])}" if args else f"a {getattr(origin, '__name__', origin)}"
    if annotation in _NAMES:
        return _NAMES[annotation]
    return article(_bare(annotation)) if isinstance(annotation, type) else article(_text(annotation))


def _text(annotation: Any) -> str:
    return annotation.__forward_arg__ if isinstance(annotation, typing.ForwardRef) else str(annotation)


_NAMES: dict[Any, str] = {
    bool: "a bool (True or False)",
    int: "an int",
    float: "a number",
    str: "a str",
    nn.Module: "an nn.Module",
    torch.Tensor: "a torch.Tensor",
    torch.optim.Optimizer: "a torch.optim.Optimizer",
}


def _bare(annotation: Any) -> str:
    """The type's name as users write it: `int`, `nn.Linear`, `torch.device`, `WatchResults`."""
    if not isinstance(annotation, type):
        if typing.get_origin(annotation) is None:
            return _text(annotation)
        return describe(annotation).removeprefix("a ").removeprefix("an ")
    module, name = annotation.__module__, annotation.__name__
    if module.startswith("torch.nn"):
        return f"nn.{name}"
    return f"torch.{name}" if module.startswith("torch") else name


def article(word: str) -> str:
    """`word` with "a" or "an" before it."""
    return f"an {word}" if word[:1].lower() in "aeiou" or word.startswith("nn.") else f"a {word}"


def types_in(annotation: Any) -> list[type]:
    """The classes an annotation names, items of containers included."""
    if isinstance(annotation, type):
        return [annotation]
    return [t for arg in typing.get_args(annotation) for t in types_in(arg)]


def members(annotation: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(annotation)
    return (annotation,)
