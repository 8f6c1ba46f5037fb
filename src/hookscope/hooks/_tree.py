"""Walk and rebuild nested outputs (tuples, lists, dicts of any kind, namedtuples, dataclasses) by their tensor
leaves. The output itself is never changed (rebuilding makes new containers), and iterators such as generators
are leaves: walking them would consume them."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["first_float", "is_plain", "map_tensors", "tensor_leaves"]


def is_plain(tensor: torch.Tensor) -> bool:
    """Whether statistics can read `tensor` as it is: a strided (dense) tensor, not sparse, not nested."""
    return tensor.layout == torch.strided and not tensor.is_nested


def first_float(output: Any) -> torch.Tensor | None:
    """Return the first floating-point tensor in `output` (a tensor or nested container), or `None`."""
    if type(output) is torch.Tensor:
        return output if output.is_floating_point() else None
    for _, tensor in tensor_leaves(output):
        if tensor.is_floating_point():
            return tensor
    return None


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
    elif _is_dataclass(value):
        for item in dataclasses.fields(value):
            yield from tensor_leaves(getattr(value, item.name), _join(prefix, item.name))


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Return `value` rebuilt with `fn` applied to every tensor leaf; other leaves are kept as they are."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return _map_dict(value, fn)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(map_tensors(item, fn) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(item, fn) for item in value)
    if _is_dataclass(value):
        return _map_dataclass(value, fn)
    return value


def _map_dict(value: dict[Any, Any], fn: Callable[[torch.Tensor], Any]) -> dict[Any, Any]:
    """A new dict of `value`'s type; dicts whose constructor takes other arguments (`defaultdict`) are copied."""
    items = [(key, map_tensors(item, fn)) for key, item in value.items()]
    try:
        return type(value)(items)
    except TypeError:  # defaultdict(factory, ...), Counter-like types: copy (keeps the factory), then fill
        new = copy.copy(value)
        for key, item in items:
            new[key] = item
        return new


def _map_dataclass(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """A shallow copy of the dataclass instance `value` with its fields mapped (frozen ones too)."""
    new = copy.copy(value)
    for item in dataclasses.fields(value):
        object.__setattr__(new, item.name, map_tensors(getattr(value, item.name), fn))
    return new


def _is_dataclass(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key
