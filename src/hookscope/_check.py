"""Argument checks of public entry points: types read from the annotations, value rules declared beside them.

`@checked(every=POSITIVE, near_zero=FINITE)` on a public function, or on a class's `__init__`, checks every
argument passed before the body runs: that it fits the parameter's annotation (`nn.Module`, `int`, `str | None`,
`Iterable[str]`, `Callable[...]`, `tuple[float, float]`, `os.PathLike` ...) and the rules given for it. A misfit
raises `TypeError` (wrong type) or `ValueError` (wrong value) saying `<argument> must be <what>, got <value>`,
with a hint on the fix where a common mistake has one. Defaults are never checked (they are right by
construction), `Any` and `object` accept everything, and annotations are read once, at the first call.
"""

from __future__ import annotations

import collections.abc as abc
import datetime
import functools
import inspect
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import torch
import torch.nn as nn

from ._errors import closest_names
from ._types import article, compile_test, describe, fits, members, number, resolve, types_in

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
    "aliases",
    "between",
    "check_callable",
    "checked",
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


POSITIVE = Want(lambda v: not number(v) or v > 0, "> 0")
NON_NEGATIVE = Want(lambda v: not number(v) or v >= 0, ">= 0")
FINITE = Want(lambda v: not isinstance(v, float) or math.isfinite(v), "finite", before=True)
PROBABILITY = Want(lambda v: not number(v) or 0 <= v <= 1, "in [0, 1]")
TIMEOUT = Want(lambda v: not isinstance(v, datetime.timedelta) or v.total_seconds() > 0, "longer than 0 seconds")
NON_EMPTY = Want(lambda v: not isinstance(v, abc.Sized) or len(v) > 0, "non-empty", before=True)
DEVICE = Want(lambda v: not isinstance(v, str) or _is_device(v), "naming a torch device, such as 'cpu' or 'cuda:0'")
FIGSIZE = Want(
    lambda v: not isinstance(v, (tuple, list)) or all(number(x) and 0 < x < math.inf for x in v),
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
        lambda v: not number(v) or ((low < v if open_low else low <= v) and v <= high), f"in {bracket}{low}, {high}]"
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
    return text if plain else f"{text} ({article(type(value).__name__)})"


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


def aliases(**old_names: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Also accept keyword arguments under the names the first releases (the seed) gave them:
    `@aliases(layer_names="select")`.

    Such a keyword is passed on under the current name, without a warning (a published signature does not go
    away); the old and the current name together (by keyword, or the current one by position) raise `TypeError`
    naming both. Put it above `@checked()`, so the checks and their messages use the current name.
    """

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        owner = function.__qualname__.removesuffix(".__init__")
        positions: dict[str, int] | None = None

        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            nonlocal positions
            for old, new in old_names.items():
                if old not in kwargs:
                    continue
                if positions is None:
                    positions = _positions(function)
                if new in kwargs or positions.get(new, len(args)) < len(args):
                    raise TypeError(f"{owner}() got both {old}= and {new}=; {old}= is another name of {new}=: pass one")
                kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        wrapper.__hookscope_aliases__ = dict(old_names)  # type: ignore[attr-defined]
        return wrapper

    return decorate


def _positions(function: Callable[..., Any]) -> dict[str, int]:
    """Parameter name -> its position, for the parameters that can be passed by position."""
    parameters = inspect.signature(function).parameters.values()
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return {p.name: index for index, p in enumerate(positional)}


class _Plan:
    """The checks of one function: per parameter, its annotation's test and description, and its rules."""

    def __init__(self, function: Callable[..., Any], rules: dict[str, Want | tuple[Want, ...]]) -> None:
        signature = inspect.signature(function)
        parameters = list(signature.parameters.values())
        self.owner = function.__qualname__.removesuffix(".__init__")
        self.method = function.__name__ if parameters and parameters[0].name == "self" else None
        self.positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.var_positional = next((p.name for p in parameters if p.kind == p.VAR_POSITIONAL), None)
        self.var_keyword = next((p.name for p in parameters if p.kind == p.VAR_KEYWORD), None)
        unknown = set(rules) - set(signature.parameters)
        if unknown:
            raise TypeError(f"checked() got rules for {sorted(unknown)}, which {function.__qualname__} does not take")
        annotations = {p.name: resolve(p.annotation, function) for p in parameters}
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
            if target is None:
                raise TypeError(self._unexpected(name, args[0] if self.method and args else None))
            self._one(target, value, shown_as=name)

    def _unexpected(self, name: str, instance: object = None) -> str:
        """The message for a keyword the function does not take: the closest ones it does take. A method names the
        class of the object it was called on (a public subclass, not the private base that defines it)."""
        close = closest_names(name, [k for k in self.checks if k not in (self.var_positional, "self")], n=3)
        hint = f"; did you mean {' or '.join(f'{c}=' for c in close)}?" if close else ""
        owner = self.owner
        if instance is not None:
            owner = type(instance).__name__ + ("" if self.method == "__init__" else f".{self.method}")
        return f"{owner}() got an unexpected keyword argument {name!r}{hint}"

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
        return article(f"{want.what} {kind.split(' ', 1)[-1]}")
    return f"{kind} {want.what}"


def _is_choice(value: Any, annotation: Any) -> bool:
    choices = [c for m in members(annotation) if typing.get_origin(m) is typing.Literal for c in typing.get_args(m)]
    return any(type(value) is type(choice) for choice in choices)


def _as_tuple(rules: Want | tuple[Want, ...]) -> tuple[Want, ...]:
    return rules if isinstance(rules, tuple) else (rules,)


def _hint(value: Any, annotation: Any) -> str:
    """A fix for the common mistakes: a class for an instance, a str for a list, a call's result for a callable;
    or what the expected type's `argument_hint` says."""
    if isinstance(value, type) and fits(_instance_of(value), annotation):
        return f"; pass an instance (e.g. {value.__name__}(...)), not the class"
    hints = [_HINTS[t] for t in types_in(annotation) if t in _HINTS]
    if hints:
        return f"; use {hints[0]}"
    if isinstance(value, str) and fits([value], annotation):
        return f"; wrap a single name in a list: [{value!r}]"
    if isinstance(value, str) and fits(nn.Module(), annotation) and not fits(_hint, annotation | str):
        return "; pass the module itself (model.get_submodule(path) finds one by its path)"
    if not callable(value) and fits(_hint, annotation) and not fits(object(), annotation):
        return "; pass the function itself, not the result of calling it"
    return ""


def _instance_of(cls: type) -> Any:
    try:
        return object.__new__(cls)
    except TypeError:
        return None
