"""Walk and rebuild nested outputs (tuples, lists, dicts, namedtuples) by their tensor leaves."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["map_tensors", "tensor_leaves"]


def tensor_leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(key path, tensor)` for every tensor inside `value`, depth first, in order.

    The key path is `""` for a bare tensor, `"0"`, `"1.logits"` ... for nested containers.
    """
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from tensor_leaves(item, _join(prefix, str(key)))
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from tensor_leaves(item, _join(prefix, str(index)))


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Return `value` rebuilt with `fn` applied to every tensor leaf; other leaves are kept as they are."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return type(value)((key, map_tensors(item, fn)) for key, item in value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(map_tensors(item, fn) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(item, fn) for item in value)
    return value


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key
