"""Which layers have weights, and how to reach their weight tensors without `.data`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from ..hooks import HookHandle, Selector, named_modules
from ..hooks._select import choose_modules

__all__ = ["HandleGroup", "effective_weight", "has_weight", "unit_rows", "weight_layers", "weight_parameter"]


def has_weight(module: nn.Module) -> bool:
    """Whether `module` has a `weight` parameter of its own (a parametrized `weight` counts)."""
    if parametrize.is_parametrized(module, "weight"):
        return True
    return isinstance(module._parameters.get("weight"), torch.Tensor)


def weight_layers(model: nn.Module, layer_names: Selector = None) -> list[tuple[str, nn.Module]]:
    """Return the `(path, module)` pairs chosen by `layer_names` that have a weight, in model order.

    `layer_names=None` picks every module with a weight of its own; otherwise it is any hookscope selector
    (a dotted path, a glob, a list of them, a module type, a predicate).

    Raises:
        ValueError: a name matches no module (the message lists the closest paths), or nothing chosen has a
            weight.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if layer_names is None:
        return [(path, module) for path, module in named_modules(model) if has_weight(module)]
    chosen = [
        (path, module) for path, module in choose_modules(model, layer_names, "layer_names") if has_weight(module)
    ]
    if not chosen:
        raise ValueError(
            f"layer_names must choose at least one module with a weight parameter, got {layer_names!r}; "
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
    weight = module._parameters["weight"]
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


class HandleGroup:
    """Hook handles placed together: `remove()` removes them all (idempotent); usable as a context manager."""

    def __init__(self, handles: Iterable[HookHandle] = ()) -> None:
        self.handles: list[HookHandle] = list(handles)

    def remove(self) -> None:
        """Remove every handle, newest first; calling it again does nothing."""
        while self.handles:
            self.handles.pop().remove()

    def __iter__(self) -> Iterator[HookHandle]:
        return iter(self.handles)

    def __len__(self) -> int:
        return len(self.handles)

    def __enter__(self) -> HandleGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()
