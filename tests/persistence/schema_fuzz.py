"""Mutations of a valid document that its schema must refuse, one or more per field, for the loader fuzz tests.

`mutations(schema, document)` walks a valid document alongside its schema and lists, for every field it meets,
the changes that break it: drop it (a required key), change a tensor's dtype, shape or length, give it a value
of the wrong JSON type, add an unknown key, change a constant (a version, a type name), break a bound. Each
mutation knows the field name the loader's error must give. Which changes are invalid is read from the schema's
declaration (required or optional keys, allowed dtypes, fixed or free sizes), never from running the validator.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from hookscope._schema import (
    Bool,
    Const,
    Either,
    Field,
    Float,
    Int,
    Json,
    ListOf,
    MapOf,
    Null,
    Part,
    Record,
    Str,
    Tensor,
)

Path = tuple[Any, ...]
EXTRA = "__dict__"  # an extra key that would be an attack if names became attributes


@dataclass(frozen=True)
class Mutation:
    """One invalid change: `apply(document)` returns a changed deep copy; the error must name `field` (and
    `key`, for an added key)."""

    field: str
    kind: str
    path: Path
    change: Callable[[Any], Any]  # old value -> new value (or DROP)
    key: str | None = None

    def apply(self, document: Any) -> Any:
        changed = copy.deepcopy(document)
        if not self.path:
            return self.change(changed)
        *parents, last = self.path
        holder = changed
        for key in parents:
            holder = holder[key]
        new = self.change(holder[last])
        if new is DROP:
            del holder[last]
        else:
            holder[last] = new
        return changed


DROP = object()


def _wrong_type(field: Field) -> Any:
    """A value of a JSON type `field` never accepts (`None` for free-form JSON, which accepts every one)."""
    options = field.options if isinstance(field, Either) else (field,)
    if any(isinstance(o, Json) for o in options):
        return None
    return 12345 if any(isinstance(o, Str) for o in options) else "garbage"


def _other_dtype(field: Tensor) -> torch.dtype:
    return next(
        d for d in (torch.complex64, torch.bool, torch.int8) if str(d).removeprefix("torch.") not in field.dtypes
    )


def _grow(tensor: torch.Tensor) -> torch.Tensor:
    return torch.cat(
        [tensor, tensor[-1:] if len(tensor) else torch.zeros_like(tensor[:1].expand(1, *tensor.shape[1:]))]
    )


def mutations(field: Field, value: Any, at: str = "state", path: Path = ()) -> Iterator[Mutation]:
    """Every invalid change of `value` (valid for `field`) and of what it holds."""
    wrong = _wrong_type(field)
    if path and wrong is not None:  # the root's type is checked by each loader's own first line
        yield Mutation(at, "wrong JSON type", path, lambda _: wrong)
    if isinstance(field, Either):
        chosen = next((o for o in field.options if _matches(o, value)), None)
        if chosen is not None and not isinstance(chosen, Null):
            yield from (m for m in mutations(chosen, value, at, path) if m.kind != "wrong JSON type")
    elif isinstance(field, Record):
        yield from _record(field, value, at, path)
    elif isinstance(field, MapOf):
        named = isinstance(field.key, Str) and field.key.choices is not None  # only these names are allowed
        wrong = _wrong_type(field.value)
        if named or wrong is not None or field.keys_in:
            yield Mutation(at, "extra key", path, lambda old: {**old, EXTRA: wrong}, key=EXTRA)
        for key, item in value.items():
            yield from mutations(field.value, item, f"{at}[{key!r}]", (*path, key))
    elif isinstance(field, ListOf):
        yield from _list(field, value, at, path)
    elif isinstance(field, Tensor):
        yield from _tensor(field, value, at, path)
    elif isinstance(field, Int) and field.min is not None:
        yield Mutation(at, "out of bounds", path, lambda _: field.min - 1)
    elif isinstance(field, Str) and field.choices is not None:
        yield Mutation(at, "unknown choice", path, lambda _: "\x00not-a-choice")
    elif isinstance(field, Const):
        yield Mutation(
            at, "wrong version or identity", path, lambda old: old + 1 if isinstance(old, int) else f"{old}x"
        )


def _matches(field: Field, value: Any) -> bool:
    """Which option of an `Either` a valid value took, read from the declaration (no validator run)."""
    if isinstance(field, Null):
        return value is None
    if isinstance(field, Tensor):
        return isinstance(value, torch.Tensor)
    if isinstance(field, (Record, MapOf, Part)):
        return isinstance(value, dict)
    if isinstance(field, ListOf):
        return isinstance(value, (list, tuple))
    if isinstance(field, Str):
        return isinstance(value, str)
    if isinstance(field, Bool):
        return isinstance(value, bool)
    if isinstance(field, (Int, Float)):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def _record(field: Record, value: dict[str, Any], at: str, path: Path) -> Iterator[Mutation]:
    yield Mutation(at, "extra key", path, lambda old: {**old, EXTRA: 1}, key=EXTRA)
    for name, child in [*field.fields.items(), *field.optional.items()]:
        if name not in value:
            continue
        if name in field.fields:
            yield Mutation(f"{at}.{name}", "dropped", (*path, name), lambda _: DROP)
        yield from mutations(child, value[name], f"{at}.{name}", (*path, name))


def _list(field: ListOf, value: list[Any], at: str, path: Path) -> Iterator[Mutation]:
    if (field.length is not None and field.length != "*") or field.max_length is not None:
        extra = value[-1] if value else None
        grow = (lambda old: [*old, *[copy.deepcopy(extra)] * (1 + len(old))]) if field.max_length else None
        yield Mutation(at, "wrong length", path, grow or (lambda old: [*old, copy.deepcopy(extra)]))
    for index, item in enumerate(value):
        yield from mutations(field.item, item, f"{at}[{index}]", (*path, index))


def _tensor(field: Tensor, value: torch.Tensor, at: str, path: Path) -> Iterator[Mutation]:
    if field.dtypes:
        yield Mutation(at, "wrong dtype", path, lambda old: old.to(_other_dtype(field)))
    if field.shape is not None:
        yield Mutation(at, "wrong shape", path, lambda old: old.unsqueeze(-1))
        if field.shape and field.shape[0] != "*":
            yield Mutation(at, "wrong length", path, _grow)


def is_about(error: BaseException, mutation: Mutation) -> bool:
    """Whether the error names the mutated field (or names it as the field that fixed the size it broke), and
    the added key."""
    message = str(error)
    return mutation.field in message and (mutation.key is None or repr(mutation.key) in message)
