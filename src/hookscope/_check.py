"""Argument checks of public entry points: types read from the annotations, value rules declared beside them.

`@checked(every=POSITIVE, near_zero=FINITE)` on a public function, or on a class's `__init__`, checks every
argument passed before the body runs: that it fits the parameter's annotation (`nn.Module`, `int`, `str | None`,
`Iterable[str]`, `Callable[...]`, `tuple[float, float]`, `os.PathLike` ...) and the rules given for it. A misfit
raises `TypeError` (wrong type) or `ValueError` (wrong value) saying `<argument> must be <what>, got <value>`,
with a hint on the fix where a common mistake has one. Defaults are never checked (they are right by
construction), `Any` and `object` accept everything, and annotations are read once, at the first call.
"""

from __future__ import annotations

import builtins
import collections.abc as abc
import datetime
import functools
import inspect
import math
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import torch
import torch.nn as nn

__all__ = [
    "DEVICE",
    "FIGSIZE",
    "FINITE",
    "NON_EMPTY",
    "NON_NEGATIVE",
    "POSITIVE",
    "PROBABILITY",
    "TIMEOUT",
    "Want",
    "between",
    "check_callable",
    "checked",
    "describe",
    "dims",
    "hint_for",
    "one_of",
    "shown",
]

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Want:
    """A rule on a value: `holds(value)` must be true; `what` completes "<argument> must be ...", e.g. "> 0"."""

    holds: Callable[[Any], bool]
    what: str
    before: bool = False  # "a non-empty list of str", not "a list of str non-empty"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


POSITIVE = Want(lambda v: not _number(v) or v > 0, "> 0")
NON_NEGATIVE = Want(lambda v: not _number(v) or v >= 0, ">= 0")
FINITE = Want(lambda v: not isinstance(v, float) or math.isfinite(v), "finite")
PROBABILITY = Want(lambda v: not _number(v) or 0 <= v <= 1, "in [0, 1]")
TIMEOUT = Want(lambda v: not isinstance(v, datetime.timedelta) or v.total_seconds() > 0, "longer than 0 seconds")
NON_EMPTY = Want(lambda v: not isinstance(v, abc.Sized) or len(v) > 0, "non-empty", before=True)
DEVICE = Want(lambda v: not isinstance(v, str) or _is_device(v), "naming a torch device, such as 'cpu' or 'cuda:0'")
FIGSIZE = Want(
    lambda v: not isinstance(v, (tuple, list)) or all(_number(x) and 0 < x < math.inf for x in v),
    "of positive finite sizes (width, height) in inches",
)


def _is_device(name: str) -> bool:
    try:
        torch.device(name)
    except RuntimeError:
        return False
    return True


def dims(count: int) -> Want:
    """Tensors of `count` dims."""
    return Want(lambda v: not isinstance(v, torch.Tensor) or v.dim() == count, f"with {count} dim{'s' * (count != 1)}")


def between(low: float, high: float, *, open_low: bool = False) -> Want:
    """Numbers in `[low, high]` (`(low, high]` with `open_low`)."""
    bracket = "(" if open_low else "["
    return Want(
        lambda v: not _number(v) or ((low < v if open_low else low <= v) and v <= high), f"in {bracket}{low}, {high}]"
    )


def one_of(choices: abc.Iterable[Any]) -> Want:
    """One of `choices` (for a str argument, or each item of an iterable of str)."""
    options = tuple(choices)

    def holds(value: Any) -> bool:
        items = [value] if isinstance(value, str) or not isinstance(value, abc.Iterable) else list(value)
        return all(item in options for item in items)

    return Want(holds, f"one of {', '.join(map(repr, options))}")


def shown(value: Any) -> str:
    """`value` for an error message: its repr, cut at 80 characters, and its type when the repr does not say."""
    text = repr(value)
    text = text if len(text) <= 80 else f"{text[:77]}..."
    plain = value is None or isinstance(value, (bool, int, float, str, list, tuple, dict))
    return text if plain else f"{text} (a {type(value).__name__})"


_HINTS: dict[type, str] = {}


def hint_for(cls: type, text: str) -> None:
    """Say, in the errors for an argument of type `cls`, what to pass instead: "...; use <text>"."""
    _HINTS[cls] = text


def check_callable(argument: str, value: Any, arguments: int, contract: str) -> None:
    """Raise unless `value` is a callable that can be called with `arguments` positional arguments.

    Raises:
        TypeError: `value` is not callable, or its signature cannot take that many arguments.
    """
    if not callable(value):
        raise TypeError(f"{argument} must be a callable {contract}, got {shown(value)}; pass the function itself")
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return  # a builtin without a signature: trust it
    try:
        signature.bind(*range(arguments))
    except TypeError:
        raise TypeError(
            f"{argument} must be a callable {contract}, got {shown(value)} with signature {signature}; "
            f"it must take {arguments} positional arguments"
        ) from None


def checked(**rules: Want | tuple[Want, ...]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Check the arguments of the decorated function against its annotations and `rules` before each call.

    Raises (from the decorated function):
        TypeError: an argument is not of its annotated type (it and the value are named, with the fix).
        ValueError: an argument breaks its rule.
    """

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        plan: _Plan | None = None

        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            nonlocal plan
            if plan is None:
                plan = _Plan(function, rules)
            plan.check(args, kwargs)
            return function(*args, **kwargs)

        wrapper.__hookscope_rules__ = rules  # type: ignore[attr-defined]
        return wrapper

    return decorate


class _Plan:
    """The checks of one function: per parameter, its annotation's test and description, and its rules."""

    def __init__(self, function: Callable[..., Any], rules: dict[str, Want | tuple[Want, ...]]) -> None:
        signature = inspect.signature(function)
        parameters = list(signature.parameters.values())
        self.owner = function.__qualname__.removesuffix(".__init__")
        self.positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.var_positional = next((p.name for p in parameters if p.kind == p.VAR_POSITIONAL), None)
        self.var_keyword = next((p.name for p in parameters if p.kind == p.VAR_KEYWORD), None)
        unknown = set(rules) - set(signature.parameters)
        if unknown:
            raise TypeError(f"checked() got rules for {sorted(unknown)}, which {function.__qualname__} does not take")
        annotations = {p.name: _annotation(p.annotation, function) for p in parameters}
        self.checks = {
            name: (annotation, compile_test(annotation), _as_tuple(rules.get(name, ())))
            for name, annotation in annotations.items()
        }

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        for name, value in zip(self.positional, args, strict=False):
            self._one(name, value)
        if self.var_positional is not None:
            for value in args[len(self.positional) :]:
                self._one(self.var_positional, value)
        for name, value in kwargs.items():
            target = name if name in self.checks else self.var_keyword
            if target is not None:
                self._one(target, value, shown_as=name)

    def _one(self, name: str, value: Any, shown_as: str | None = None) -> None:
        annotation, test, wants = self.checks[name]
        if test(value) and all(want.holds(value) for want in wants):
            return
        label = shown_as or name
        if not test(value) and _is_choice(value, annotation):  # right type, not one of the allowed values
            raise ValueError(f"{label} must be {describe(annotation)}, got {shown(value)}")
        if not test(value):
            raise TypeError(f"{label} must be {describe(annotation)}, got {shown(value)}{_hint(value, annotation)}")
        for want in wants:
            if not want.holds(value):
                what = _wanted(want, describe(annotation))
                raise ValueError(f"{label} must be {what}, got {shown(value)}")


def _wanted(want: Want, kind: str) -> str:
    if want.what.startswith("one of"):
        return want.what
    if want.before:
        return _article(f"{want.what} {kind.split(' ', 1)[-1]}")
    return f"{kind} {want.what}"


def _is_choice(value: Any, annotation: Any) -> bool:
    choices = [c for m in _members(annotation) if typing.get_origin(m) is typing.Literal for c in typing.get_args(m)]
    return any(type(value) is type(choice) for choice in choices)


def _as_tuple(rules: Want | tuple[Want, ...]) -> tuple[Want, ...]:
    return rules if isinstance(rules, tuple) else (rules,)


class _Lenient(dict[str, Any]):
    """Resolve names as the module does; names only type checkers see (`if TYPE_CHECKING:` imports) read as Any."""

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
        return Any


def _annotation(annotation: Any, function: Callable[..., Any]) -> Any:
    if annotation is inspect.Parameter.empty:
        return Any
    if isinstance(annotation, str):
        namespace = getattr(function, "__globals__", {})
        try:
            return eval(annotation, namespace, _Lenient(namespace))  # our own source text
        except Exception:
            return Any
    return annotation


Test = Callable[[Any], bool]


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
    float: _number,
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
        return _article(f"{_bare(args[0])} class") if args else "a class"
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
    return _article(_bare(annotation)) if isinstance(annotation, type) else _article(_text(annotation))


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


def _article(word: str) -> str:
    return f"an {word}" if word[:1].lower() in "aeiou" or word.startswith("nn.") else f"a {word}"


def _hint(value: Any, annotation: Any) -> str:
    """A fix for the common mistakes: a class for an instance, a str for a list, a call's result for a callable;
    or what the expected type's `argument_hint` says."""
    if isinstance(value, type) and fits(_instance_of(value), annotation):
        return f"; pass an instance (e.g. {value.__name__}(...)), not the class"
    hints = [_HINTS[t] for t in _types_in(annotation) if t in _HINTS]
    if hints:
        return f"; use {hints[0]}"
    if isinstance(value, str) and fits([value], annotation):
        return f"; wrap a single name in a list: [{value!r}]"
    if isinstance(value, str) and fits(nn.Module(), annotation) and not fits(_hint, annotation | str):
        return "; pass the module itself (model.get_submodule(path) finds one by its path)"
    if not callable(value) and fits(_hint, annotation) and not fits(object(), annotation):
        return "; pass the function itself, not the result of calling it"
    return ""


def _types_in(annotation: Any) -> list[type]:
    """The classes an annotation names, items of containers included."""
    if isinstance(annotation, type):
        return [annotation]
    return [t for arg in typing.get_args(annotation) for t in _types_in(arg)]


def _members(annotation: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(annotation)
    return (annotation,)


def _instance_of(cls: type) -> Any:
    try:
        return object.__new__(cls)
    except TypeError:
        return None
