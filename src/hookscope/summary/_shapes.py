"""Describe the inputs and outputs of a module call as nested shapes, and format them.

A description keeps the structure of the value: a tensor becomes its `torch.Size`, a tuple or list a tuple of
descriptions, a dict or namedtuple a dict of descriptions (by key or field name), and any other leaf a short string
(`"None"`, `"3"`, `"'mean'"`). Values that are not tensors but have a shape become an `ObjectShape`: a numpy (or
any array-API) array `ndarray[2, 3]`, a `torch.distributions.Distribution` the shape of one sample,
`Normal[2, 3]`, and an object holding tensors in its attributes (a dataclass, a plain object) its tensor-holding
fields, `Output(logits: [2, 3])`. Descriptions hold no tensor, so keeping them never keeps memory alive.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributions import Distribution

__all__ = ["ObjectShape", "as_lists", "describe", "describe_call", "format_shape", "tensor_bytes"]

_MAX_REPR = 24
_MAX_NESTING = 4  # objects inside objects: how deep attributes are followed


@dataclass(frozen=True)
class ObjectShape:
    """The shape of a value that is not a tensor: an array or a distribution (`shape`), or an object's fields."""

    type: str
    shape: torch.Size | None = None
    fields: tuple[tuple[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return `{"type", "shape"}` or `{"type", "fields"}` as JSON-ready values."""
        if self.shape is not None:
            return {"type": self.type, "shape": list(self.shape)}
        return {"type": self.type, "fields": {name: as_lists(item) for name, item in self.fields}}


def _array_shape(value: Any) -> torch.Size | None:
    """The shape of an array-like that is not a tensor (numpy, array API), if it has an int tuple `shape`."""
    shape = getattr(value, "shape", None)
    if isinstance(value, type) or not isinstance(shape, tuple) or not hasattr(value, "dtype"):
        return None
    return torch.Size(shape) if all(isinstance(d, int) for d in shape) else None


def _object_fields(value: Any) -> list[tuple[str, Any]]:
    """The public attributes of a dataclass or plain object that hold a tensor, array or distribution."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value)]
    else:
        items = list(getattr(value, "__dict__", {}).items())
    return [(name, item) for name, item in items if not name.startswith("_") and _holds_tensors(item)]


def _holds_tensors(value: Any, nesting: int = 0) -> bool:
    """Whether `value` is, or is a container (dict, list, tuple) of, tensors, arrays or distributions."""
    if isinstance(value, (torch.Tensor, Distribution)) or _array_shape(value) is not None:
        return True
    if nesting >= _MAX_NESTING:
        return False
    if isinstance(value, dict):
        return any(_holds_tensors(item, nesting + 1) for item in value.values())
    if isinstance(value, (tuple, list)):
        return any(_holds_tensors(item, nesting + 1) for item in value)
    return False


def describe(value: Any, *, is_field: bool = False) -> Any:
    """Return the nested shape description of `value` (no tensor is kept).

    Objects inside the fields of an object (`is_field`) are named, not followed: descriptions stay finite.
    """
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, dict):
        return {str(key): describe(item, is_field=is_field) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple: keep the field names
        fields = zip(value._fields, value, strict=True)
        return {str(name): describe(item, is_field=is_field) for name, item in fields}
    if isinstance(value, (tuple, list)):
        return tuple(describe(item, is_field=is_field) for item in value)
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        text = repr(value)
        return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 4] + "...'"
    return _describe_object(value, is_field)


def _describe_object(value: Any, is_field: bool) -> Any:
    name = type(value).__name__
    if isinstance(value, Distribution):
        return ObjectShape(name, shape=value.batch_shape + value.event_shape)  # the shape of one sample
    shape = _array_shape(value)
    if shape is not None:
        return ObjectShape(name, shape=shape)
    fields = [] if is_field or isinstance(value, torch.nn.Module) else _object_fields(value)
    if not fields:
        return name
    return ObjectShape(name, fields=tuple((key, describe(item, is_field=True)) for key, item in fields))


def describe_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Describe the arguments of a call: the bare description for one positional argument, else a tuple/dict.

    Keyword arguments passed as `None` (left at their default, as a rule) are left out.
    """
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    if not kwargs:
        return describe(args[0]) if len(args) == 1 else describe(args)
    if not args:
        return describe(kwargs)
    return (*describe(args), describe(kwargs))


def tensor_bytes(value: Any, *, is_field: bool = False) -> int:
    """Return the bytes taken by every tensor inside `value` (from shapes and dtypes only, no device sync).

    Tensors in the fields of an object (a dataclass, a plain object, a distribution's parameters) count too.
    """
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(item, is_field=is_field) for item in value.values())
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(item, is_field=is_field) for item in value)
    if isinstance(value, Distribution) or not (is_field or isinstance(value, (str, bytes, torch.nn.Module))):
        return sum(tensor_bytes(item, is_field=True) for _, item in _object_fields(value))
    return 0


def as_lists(description: Any) -> Any:
    """Convert a description to JSON-ready values: shapes and tuples become lists, dicts stay dicts."""
    if isinstance(description, torch.Size):
        return list(description)
    if isinstance(description, dict):
        return {key: as_lists(item) for key, item in description.items()}
    if isinstance(description, tuple):
        return [as_lists(item) for item in description]
    if isinstance(description, ObjectShape):
        return description.to_dict()
    return description


def format_shape(description: Any, batch_size: int | None = None, sep: str = ", ") -> str:
    """Format a description: `[2, 16]`, `([2, 5], ([1, 2, 5], None))`, `{logits: [2, 10]}`.

    With `batch_size`, the first dimension of every shape is replaced by it and dimensions are joined by `sep`.
    """
    if isinstance(description, torch.Size):
        dims = [str(d) for d in description]
        if batch_size is not None and dims:
            dims[0] = str(batch_size)
        return "[" + sep.join(dims) + "]"
    if isinstance(description, dict):
        items = ", ".join(f"{key}: {format_shape(item, batch_size, sep)}" for key, item in description.items())
        return "{" + items + "}"
    if isinstance(description, tuple):
        inner = ", ".join(format_shape(item, batch_size, sep) for item in description)
        return "(" + inner + ("," if len(description) == 1 else "") + ")"
    if isinstance(description, ObjectShape):
        if description.shape is not None:
            return description.type + format_shape(description.shape, batch_size, sep)
        items = ", ".join(f"{key}: {format_shape(item, batch_size, sep)}" for key, item in description.fields)
        return f"{description.type}({items})"
    return str(description)
