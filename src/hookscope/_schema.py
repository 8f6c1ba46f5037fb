"""Formats of saved data, declared once next to the code that writes them, and one validator for all of them.

A schema is a tree of fields:

    Record(steps=Tensor(INT, shape=("steps",)), ...)   a dict with exactly these keys (`optional=` for the rest)
    MapOf(Tensor(FLOAT, shape=("steps",)))            a dict with free keys: names from a file, never attributes
    ListOf(Int(min=0), length="modules")              a list (or tuple)
    Tensor(dtypes, shape=(2, "modules", "*"))         a tensor of one of `dtypes`; dims: an int, a symbol, "*"
    Int(min=, below=), Float(), Str(), Bool(), Null(), Const(value), Json(), Optional(field), Either(fields)

Symbols tie sizes together across a document: the first dim, length or bound that meets the symbol `"steps"`
binds it, every later one must agree; `"bins+1"` is one more than `bins`; `{key}` inside a symbol is the key of
the innermost `MapOf` entry (`"bins of {key}"` ties a layer's histogram to its own edges). The object that loads
can fix symbols beforehand (`bind={"capacity": 4}`). `MapOf(..., name="layers")` records its keys, and a later
`MapOf(..., keys_in="layers")` may only use those. `Record(..., rules=[Rule(...)])` adds checks across fields.

`check(schema, document, source)` walks the whole document before anything is applied and raises one
`SchemaError` (a `ValueError`) naming the source (a file, or "state"), the field (`activations['0']['mean']`),
what was expected and what was found.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch

__all__ = [
    "FLOAT",
    "INT",
    "Bool",
    "Const",
    "Either",
    "Field",
    "Float",
    "Int",
    "Json",
    "ListOf",
    "MapOf",
    "Null",
    "Optional",
    "Part",
    "Record",
    "Rule",
    "SchemaError",
    "Str",
    "Tensor",
    "check",
    "found",
]

FLOAT = ("float32", "float64")
"""The float dtypes statistics are kept in (float64 accumulators are float32 on MPS)."""
INT = ("int64",)
"""The dtype of counts and step numbers."""


class SchemaError(ValueError):
    """A document does not fit its schema; the message names the source, the field and what was expected."""

    def __init__(self, source: str, at: str, problem: str) -> None:
        super().__init__(f"{source}: field {at} {problem}")
        self.source, self.at, self.problem = source, at, problem

    def from_source(self, source: str) -> SchemaError:
        """The same error, said of another source (the file a state was read from)."""
        return SchemaError(source, self.at, self.problem)


@dataclass
class _Context:
    source: str
    symbols: dict[str, tuple[int, str]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    keysets: dict[str, tuple[set[str], str]] = field(default_factory=dict)

    def fail(self, at: str, problem: str) -> NoReturn:
        raise SchemaError(self.source, at, problem)

    def size(self, spec: int | str, actual: int, at: str, what: str) -> None:
        """Check that `actual` (a dim, a length) is `spec`: an int, `"*"`, or a symbol bound on first sight."""
        if spec == "*":
            return
        if isinstance(spec, int):
            if actual != spec:
                self.fail(at, f"must have {what} {spec}, got {actual}")
            return
        name, plus = _symbol(spec, self.keys[-1] if self.keys else "")
        bound = self.symbols.get(name)
        if bound is None:
            if actual - plus < 0:
                self.fail(at, f"must have {what} of at least {plus}, got {actual}")
            self.symbols[name] = (actual - plus, at)
        elif bound[0] + plus != actual:
            self.fail(at, f"must have {what} {bound[0] + plus} ({name} is {bound[0]}, from {bound[1]}), got {actual}")


def _symbol(spec: str, key: str) -> tuple[str, int]:
    text = spec.replace("{key}", repr(key))
    match = re.fullmatch(r"(.+?)\s*\+\s*(\d+)", text)
    return (match.group(1), int(match.group(2))) if match else (text, 0)


def found(value: Any) -> str:
    """Describe `value` for an error message: its type and, briefly, its content."""
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}"
    if isinstance(value, Mapping):
        keys = [repr(k) for k in list(value)[:6]]
        return f"a dict with keys [{', '.join(keys)}{', ...' if len(value) > 6 else ''}]"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(value).__name__})"


class Field:
    """One node of a schema: `check` raises through the context, `expected` says what fits."""

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        """Raise a `SchemaError` through `ctx` unless `value` fits (binding the symbols it meets)."""
        raise NotImplementedError

    def expected(self) -> str:
        """What fits, in words."""
        raise NotImplementedError

    def _wrong(self, value: Any, at: str, ctx: _Context) -> NoReturn:
        ctx.fail(at, f"must be {self.expected()}, got {found(value)}")


class Tensor(Field):
    """A tensor of one of `dtypes` (names such as "float32"; empty: any) and `shape` (`None`: any)."""

    def __init__(self, dtypes: Iterable[str] = (), shape: tuple[int | str, ...] | None = None) -> None:
        self.dtypes = tuple(dtypes)
        self.shape = shape

    def expected(self) -> str:
        kinds = " or ".join(self.dtypes) if self.dtypes else "any dtype"
        return f"a {kinds} tensor" + ("" if self.shape is None else f" of shape {self.shape}")

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        if not isinstance(value, torch.Tensor):
            self._wrong(value, at, ctx)
        if self.dtypes and str(value.dtype).removeprefix("torch.") not in self.dtypes:
            self._wrong(value, at, ctx)
        if self.shape is None:
            return
        if value.dim() != len(self.shape):
            ctx.fail(at, f"must have {len(self.shape)} dims {self.shape}, got {found(value)}")
        for index, (spec, actual) in enumerate(zip(self.shape, value.shape, strict=True)):
            ctx.size(spec, actual, at, f"dim {index} of size")


class Int(Field):
    """An int (never a bool) with `min`/`max`, and below the symbol `below` (an index into a list)."""

    def __init__(self, min: int | None = None, max: int | None = None, below: str | None = None) -> None:
        self.min, self.max, self.below = min, max, below

    def expected(self) -> str:
        bounds = [f">= {self.min}"] if self.min is not None else []
        bounds += [f"<= {self.max}"] if self.max is not None else []
        bounds += [f"< {self.below}"] if self.below is not None else []
        return "an int" + (f" {' and '.join(bounds)}" if bounds else "")

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            self._wrong(value, at, ctx)
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            self._wrong(value, at, ctx)
        if self.below is not None:
            bound = ctx.symbols.get(self.below)
            if bound is not None and value >= bound[0]:
                ctx.fail(at, f"must be < {self.below} ({bound[0]}, from {bound[1]}), got {value}")


class Float(Field):
    """A number (int or float, never a bool), NaN and infinities included."""

    def expected(self) -> str:
        return "a number"

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self._wrong(value, at, ctx)


class Str(Field):
    """A str, one of `choices` when given."""

    def __init__(self, choices: Iterable[str] | None = None) -> None:
        self.choices = None if choices is None else tuple(choices)

    def expected(self) -> str:
        return "a str" if self.choices is None else f"one of {list(self.choices)}"

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        if not isinstance(value, str) or (self.choices is not None and value not in self.choices):
            self._wrong(value, at, ctx)


class Bool(Field):
    """True or False."""

    def expected(self) -> str:
        return "a bool"

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        if not isinstance(value, bool):
            self._wrong(value, at, ctx)


class Null(Field):
    """None (JSON null)."""

    def expected(self) -> str:
        return "None"

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        if value is not None:
            self._wrong(value, at, ctx)


class Const(Field):
    """Exactly `value` (a version, a type name, a configuration), described by `what`."""

    def __init__(self, value: Any, what: str = "") -> None:
        self.value, self.what = value, what

    def expected(self) -> str:
        return f"{self.value!r}" + (f" ({self.what})" if self.what else "")

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        if type(value) is not type(self.value) or value != self.value:
            self._wrong(value, at, ctx)


class Json(Field):
    """Any plain JSON value: None, bool, int, float, str, and lists and str-keyed dicts of these."""

    def expected(self) -> str:
        return "plain JSON data"

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        if value is None or isinstance(value, (bool, int, float, str)):
            return
        if isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                self.check(item, f"{at}[{index}]", ctx)
            return
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            for key, item in value.items():
                self.check(item, f"{at}[{key!r}]", ctx)
            return
        self._wrong(value, at, ctx)


class Part(Field):
    """A dict whose content another object checks in full (a monitor's reducer state, by the reducer)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def expected(self) -> str:
        return f"a dict (the state of {self.owner})"

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        if not isinstance(value, dict):
            self._wrong(value, at, ctx)


class Either(Field):
    """One of `options` (tried in order; symbols bound by a failed try are forgotten)."""

    def __init__(self, *options: Field) -> None:
        self.options = options

    def expected(self) -> str:
        return " or ".join(option.expected() for option in self.options)

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        errors = []
        for option in self.options:
            saved = (dict(ctx.symbols), dict(ctx.keysets))
            try:
                option.check(value, at, ctx)
                return
            except SchemaError as err:
                ctx.symbols, ctx.keysets = saved
                errors.append(err)
        specific = [err for option, err in zip(self.options, errors, strict=True) if not isinstance(option, Null)]
        if len(specific) == 1:
            raise specific[0]  # None or one kind: that kind's own message is the most precise
        self._wrong(value, at, ctx)


def Optional(option: Field) -> Either:
    """`None` or `option`."""
    return Either(Null(), option)


@dataclass(frozen=True)
class Rule:
    """A check across the fields of a record: `holds(record)` must be true, else `problem` is said of `field`."""

    field: str
    holds: Callable[[Mapping[str, Any]], bool]
    problem: str


class Record(Field):
    """A dict with exactly the keys of `fields` and `named` (all required) and of `optional` (checked in this
    order, so that the fields that bind a symbol come first)."""

    def __init__(
        self,
        fields: Mapping[str, Field] | None = None,
        /,
        *,
        optional: Mapping[str, Field] | None = None,
        rules: Iterable[Rule] = (),
        **named: Field,
    ) -> None:
        self.fields = {**(fields or {}), **named}
        self.optional = dict(optional or {})
        self.rules = tuple(rules)

    def expected(self) -> str:
        return f"a dict with keys {sorted([*self.fields, *self.optional])}"

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        if not isinstance(value, Mapping):
            self._wrong(value, at, ctx)
        missing = [name for name in self.fields if name not in value]
        if missing:
            ctx.fail(f"{at}.{missing[0]}", f"is missing (every {_name(at)} has keys {sorted(self.fields)})")
        unknown = [key for key in value if key not in self.fields and key not in self.optional]
        if unknown:
            ctx.fail(at, f"has an unknown key {unknown[0]!r}; known keys: {sorted([*self.fields, *self.optional])}")
        for name, child in [*self.fields.items(), *self.optional.items()]:
            if name in value:
                child.check(value[name], f"{at}.{name}", ctx)
        for rule in self.rules:
            if not rule.holds(value):
                ctx.fail(f"{at}.{rule.field}", rule.problem)


def _name(at: str) -> str:
    return at.rsplit(".", 1)[-1].split("[")[0] or "record"


class MapOf(Field):
    """A dict from free keys (`key`: `Str()` by default) to `value`s.

    Args:
        value: The field every value must fit.
        key: The field every key must fit.
        name: Record the keys under this name, for a later `keys_in`.
        keys_in: Every key must be one of those recorded under this name.
    """

    def __init__(self, value: Field, key: Field | None = None, name: str = "", keys_in: str = "") -> None:
        self.value, self.key = value, key or Str()
        self.name, self.keys_in = name, keys_in

    def expected(self) -> str:
        return f"a dict of {self.value.expected()}"

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        if not isinstance(value, Mapping):
            self._wrong(value, at, ctx)
        allowed = ctx.keysets.get(self.keys_in) if self.keys_in else None
        for key, item in value.items():
            self.key.check(key, f"{at} key {key!r}", ctx)
            if allowed is not None and key not in allowed[0]:
                ctx.fail(f"{at}[{key!r}]", f"must be one of the keys of {allowed[1]}, which has no {key!r}")
            ctx.keys.append(str(key))
            try:
                self.value.check(item, f"{at}[{key!r}]", ctx)
            finally:
                ctx.keys.pop()
        if self.name:
            ctx.keysets[self.name] = ({str(k) for k in value}, at)


class ListOf(Field):
    """A list or tuple of `item`s, of `length` (int or symbol) when given and at most `max_length` (a symbol)."""

    def __init__(self, item: Field, length: int | str | None = None, max_length: str | None = None) -> None:
        self.item, self.length, self.max_length = item, length, max_length

    def expected(self) -> str:
        size = "" if self.length is None else f"{self.length} "
        return f"a list of {size}{self.item.expected()}"

    def check(self, value: Any, at: str, ctx: _Context) -> None:
        if not isinstance(value, (list, tuple)):
            self._wrong(value, at, ctx)
        if self.length is not None:
            ctx.size(self.length, len(value), at, "length")
        if self.max_length is not None:
            bound = ctx.symbols.get(self.max_length)
            if bound is not None and len(value) > bound[0]:
                ctx.fail(at, f"must hold at most {self.max_length} ({bound[0]}) items, got {len(value)}")
        for index, item in enumerate(value):
            self.item.check(item, f"{at}[{index}]", ctx)


def check(
    schema: Field, document: Any, source: str = "state", at: str = "state", bind: Mapping[str, int] | None = None
) -> None:
    """Check the whole `document` against `schema`; nothing is changed.

    Args:
        schema: The format.
        document: What was read (nested dicts, lists, tensors and JSON values).
        source: Where it comes from, first in the message (`"file 'run.safetensors'"`, `"state"`).
        at: The name of the document's root in field names.
        bind: Symbols the loading object fixes (sizes from its configuration).

    Raises:
        SchemaError: the first field that does not fit, with what was expected and what was found.
    """
    ctx = _Context(source, {name: (value, "the loading object") for name, value in (bind or {}).items()})
    schema.check(document, at, ctx)
