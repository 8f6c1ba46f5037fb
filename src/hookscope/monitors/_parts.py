"""The pieces monitors are built from: attribute and submodule lookup, each monitor's own reducer copy, and the
picklable `Construct` that `partialconstructor` returns for pools."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch
import torch.nn as nn

from .._errors import closest_names
from ..hooks._tree import tensor_leaves
from ..reducers._base import Reducer

if TYPE_CHECKING:
    from ._base import Monitor

__all__ = ["Construct", "as_tensors", "check_attribute", "own_copy", "resolve", "submodule"]

MonitorT = TypeVar("MonitorT", bound="Monitor")


def resolve(root: object, attr: str) -> Any:
    """Return the (dotted) attribute `attr` of `root`."""
    value = root
    for name in attr.split("."):
        value = getattr(value, name)
    return value


def check_attribute(module: nn.Module, attr: object) -> None:
    """Raise unless the dotted attribute `attr` exists on `module`, naming the closest attributes.

    Raises:
        TypeError: `attr` is not a string.
        ValueError: the attribute does not exist.
    """
    if not isinstance(attr, str) or not attr:
        raise TypeError(f"attr must be a non-empty (dotted) attribute name, got {attr!r}")
    try:
        resolve(module, attr)
    except AttributeError:
        names = [name for name, _ in module.named_parameters()] + [name for name, _ in module.named_buffers()]
        names += [name for name in vars(module) if not name.startswith("_")]
        close = closest_names(attr, names)
        hint = f" Closest: {', '.join(repr(c) for c in close)}." if close else ""
        raise ValueError(f"attr must name an attribute of the {type(module).__name__}, got {attr!r}.{hint}") from None


def submodule(module: nn.Module, attr: str) -> nn.Module:
    """Return the submodule at dotted path `attr` of `module` (`module` itself for `""`).

    Raises:
        ValueError: there is no such submodule (the message lists the closest paths).
    """
    if not attr:
        return module
    try:
        return module.get_submodule(attr)
    except AttributeError:
        close = closest_names(attr, [name for name, _ in module.named_modules() if name])
        hint = f" Closest: {', '.join(repr(c) for c in close)}." if close else ""
        raise ValueError(f"attr must name a submodule of the {type(module).__name__}, got {attr!r}.{hint}") from None


class Construct(Generic[MonitorT]):
    """`(attr, module) -> monitor`, from `partialconstructor`: a class, not a closure, so that pools copy and pickle.

    Each monitor gets its own copy of `reducer`; `attr` is the monitor's own argument (`attr_is_argument`:
    state, difference and parameter-gradient monitors) or the path of the submodule to watch.
    """

    def __init__(self, cls: type[MonitorT], reducer: Reducer, rest: tuple[Any, ...], *, attr_is_argument: bool) -> None:
        self.cls, self.reducer, self.rest, self.attr_is_argument = cls, reducer, rest, attr_is_argument

    def __call__(self, attr: str, module: nn.Module) -> MonitorT:
        if self.attr_is_argument:
            return self.cls(own_copy(self.reducer), attr, module, *self.rest)  # type: ignore[arg-type]  # subclasses taking attr
        return self.cls(own_copy(self.reducer), submodule(module, attr), *self.rest)

    def __repr__(self) -> str:
        return f"{self.cls.__name__}.partialconstructor({self.reducer!r}, ...)"


def own_copy(reducer: Reducer) -> Reducer:
    """Return a copy of `reducer` for one monitor built by a partial constructor."""
    return copy.deepcopy(reducer)


def as_tensors(value: Any) -> tuple[torch.Tensor, ...]:
    """Return the tensors of `value` (numbers become 0-d tensors), for pushing into a reducer."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (torch.as_tensor(value),)
    return tuple(tensor for _, tensor in tensor_leaves(value))
