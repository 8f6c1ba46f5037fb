"""Which layers have weights, and how to reach their weight tensors without `.data`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from ..hooks import HookHandle, named_modules
from ..hooks._select import Selector, choose_modules

__all__ = [
    "HandleGroup",
    "HookData",
    "effective_weight",
    "has_weight",
    "unit_rows",
    "weight_layers",
    "weight_parameter",
]


def has_weight(module: nn.Module) -> bool:
    """Whether `module` has a `weight` parameter of its own (a parametrized `weight` counts)."""
    if parametrize.is_parametrized(module, "weight"):
        return True
    return isinstance(dict(module.named_parameters(recurse=False)).get("weight"), torch.Tensor)


def weight_layers(model: nn.Module, select: Selector = None) -> list[tuple[str, nn.Module]]:
    """Return the `(path, module)` pairs chosen by `select` that have a weight, in model order.

    `select=None` picks every module with a weight of its own; otherwise it is any hookscope selector
    (a dotted path, a glob, a list of them, a module type, a predicate).

    Raises:
        ValueError: a name matches no module (the message lists the closest paths), or nothing chosen has a
            weight.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if select is None:
        return [(path, module) for path, module in named_modules(model) if has_weight(module)]
    chosen = [(path, module) for path, module in choose_modules(model, select, "select") if has_weight(module)]
    if not chosen:
        raise ValueError(
            f"select must choose at least one module with a weight parameter, got {select!r}; "
            "pass None to choose every module that has a weight"
        )
    return chosen


def effective_weight(module: nn.Module) -> torch.Tensor:
    """The weight the module computes with (through its parametrization, if it has one)."""
    weight = module.weight
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"module.weight must be a tensor, got {type(weight).__name__}")
    return weight


def weight_parameter(module: nn.Module) -> torch.Tensor:
    """The parameter that stores the weight: `weight`, or `parametrizations.weight.original` when parametrized.

    Raises:
        TypeError: the parametrization stores the weight in several tensors (`original0`, `original1`, ...),
            so there is no single tensor to change in place.
    """
    if parametrize.is_parametrized(module, "weight"):
        parametrizations: Any = module.parametrizations
        holder = parametrizations["weight"]
        original = getattr(holder, "original", None)
        if not isinstance(original, torch.Tensor):
            raise TypeError(
                "module's weight parametrization must store one tensor ('original'), got several "
                "('original0', ...); remove the parametrization first with parametrize.remove_parametrizations"
            )
        return original
    weight = dict(module.named_parameters(recurse=False)).get("weight")
    if weight is None:
        raise TypeError(f"module {type(module).__name__} must have a weight parameter, got None")
    return weight


def unit_rows(weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """View `weight` as `(out_features, -1)` rows, one per output unit, with the bias appended as a column.

    Shape:
        weight `(out, ...)`, bias `(out,)` -> `(out, fan_in)` or `(out, fan_in + 1)`.
    """
    rows = weight.detach().reshape(weight.shape[0], -1) if weight.dim() > 0 else weight.detach().reshape(1, 1)
    if bias is not None and bias.shape == (rows.shape[0],):
        rows = torch.cat([rows, bias.detach().reshape(-1, 1).to(rows.dtype)], dim=1)
    return rows


class HandleGroup(Sequence[HookHandle]):
    """Hook handles placed together, a sequence: `remove()` removes them all; usable as a context manager.

    The handles stay in it after `remove()` (each says `is_removed`); calling it again does nothing.
    """

    def __init__(self, handles: Iterable[HookHandle] = ()) -> None:
        self._handles: list[HookHandle] = list(handles)

    def append(self, handle: HookHandle) -> None:
        """Add a handle placed with the others."""
        self._handles.append(handle)

    @overload
    def __getitem__(self, index: int) -> HookHandle: ...
    @overload
    def __getitem__(self, index: slice) -> list[HookHandle]: ...
    def __getitem__(self, index: int | slice) -> HookHandle | list[HookHandle]:
        return self._handles[index]

    def __len__(self) -> int:
        return len(self._handles)

    def __iter__(self) -> Iterator[HookHandle]:
        return iter(self._handles)

    def remove(self) -> None:
        """Remove every handle, newest first; calling it again does nothing."""
        for handle in reversed(self._handles):
            handle.remove()

    def __eq__(self, other: object) -> bool:
        # equal to a list of the same handles, as the lists these functions returned before
        if isinstance(other, (HandleGroup, list)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def __repr__(self) -> str:
        return f"HandleGroup({self._handles!r})"

    def __enter__(self) -> HandleGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


class HookData(dict[str, Any]):
    """The dict an `add_weight_*` function returns, indexed as before, that is also its attachment's handle.

    `remove()` runs `self["remove"]()` (idempotent), and leaving a `with` block does the same, also when the
    block raises: `with add_weight_distribution_monitor(model) as data: ...`.
    """

    def __init__(self, items: dict[str, Any], remove: Callable[[], None]) -> None:
        super().__init__(items, remove=remove)
        self._remove = remove  # kept apart from the key, which the caller may overwrite

    def remove(self) -> None:
        """Remove what the function attached (hooks, snapshots); calling it again does nothing."""
        self._remove()

    def __enter__(self) -> HookData:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()
