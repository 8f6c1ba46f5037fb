"""Describe the inputs and outputs of a module call as nested shapes, and format them.

A description keeps the structure of the value: a tensor becomes its `torch.Size`, a tuple or list a tuple of
descriptions, a dict or namedtuple a dict of descriptions (by key or field name), and any other leaf a short string
(`"None"`, `"3"`, `"'mean'"`, `"Distribution"`). Descriptions hold no tensor, so keeping them never keeps memory
alive.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["as_lists", "describe", "describe_call", "format_shape", "tensor_bytes"]

_MAX_REPR = 24


def describe(value: Any) -> Any:
    """Return the nested shape description of `value` (no tensor is kept)."""
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, dict):
        return {str(key): describe(item) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple: keep the field names
        return {str(name): describe(item) for name, item in zip(value._fields, value, strict=True)}
    if isinstance(value, (tuple, list)):
        return tuple(describe(item) for item in value)
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        text = repr(value)
        return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 4] + "...'"
    return type(value).__name__


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


def tensor_bytes(value: Any) -> int:
    """Return the bytes taken by every tensor inside `value` (from shapes and dtypes only, no device sync)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(item) for item in value.values())
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(item) for item in value)
    return 0


def as_lists(description: Any) -> Any:
    """Convert a description to JSON-ready values: shapes and tuples become lists, dicts stay dicts."""
    if isinstance(description, torch.Size):
        return list(description)
    if isinstance(description, dict):
        return {key: as_lists(item) for key, item in description.items()}
    if isinstance(description, tuple):
        return [as_lists(item) for item in description]
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
    return str(description)
