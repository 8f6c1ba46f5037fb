"""Direct weight access without `.data`: read copies, write, initialize and scale the chosen layers' weights.

Writes run under `torch.no_grad()` on the stored parameter in place, so the parameter object (and the optimizer's
reference to it) stays the same and its version counter moves on: autograd then refuses to backpropagate
through a graph that saved the old value, where `.data` would silently compute wrong gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from .._check import aliases, check_callable, checked
from .._errors import unknown_name
from ..hooks import named_modules
from ..hooks._select import Selector
from ._layers import effective_weight, has_weight, weight_layers, weight_parameter

__all__ = ["get_weights", "init_weights_", "scale_weights_", "set_weights_"]


@aliases(layer_names="select")
@checked()
def get_weights(model: nn.Module, select: Selector = None) -> dict[str, torch.Tensor]:
    """Return path -> a detached copy of each chosen layer's weight (as the module computes with it)."""
    return {path: effective_weight(module).detach().clone() for path, module in weight_layers(model, select)}


@checked()
def set_weights_(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Copy each tensor of `weights` (path -> tensor) into that layer's weight, in place.

    A parametrized weight is assigned through its parametrization (`right_inverse`).

    Raises:
        ValueError: a path names no layer with a weight, or a tensor's shape differs from the weight's.
    """
    modules = dict(named_modules(model))
    for path, value in weights.items():
        module = modules.get(path)
        if module is None or not has_weight(module):
            raise ValueError(unknown_name("weights", path, modules, what="layer path"))
        current = effective_weight(module)
        if tuple(value.shape) != tuple(current.shape):
            raise ValueError(
                f"weights[{path!r}] must have the weight's shape {tuple(current.shape)}, got {tuple(value.shape)}"
            )
        with torch.no_grad():
            if parametrize.is_parametrized(module, "weight"):
                module.weight = value.detach().to(current.device, current.dtype)
            else:
                weight_parameter(module).copy_(value)


@aliases(layer_names="select")
@checked()
def init_weights_(model: nn.Module, init: Callable[[torch.Tensor], Any], select: Selector = None) -> list[str]:
    """Call `init(weight)` (e.g. `torch.nn.init.orthogonal_`) on each chosen layer's stored weight, in place.

    For a parametrized weight, the stored tensor is `parametrizations.weight.original`.

    Returns:
        The paths of the initialized layers.
    """
    check_callable("init", init, 1, "init(weight) -> Any, such as torch.nn.init.orthogonal_")
    paths = []
    for path, module in weight_layers(model, select):
        with torch.no_grad():
            init(weight_parameter(module))
        paths.append(path)
    return paths


@aliases(layer_names="select")
@checked()
def scale_weights_(model: nn.Module, factor: float, select: Selector = None) -> list[str]:
    """Multiply each chosen layer's stored weight by `factor`, in place.

    Raises:
        ValueError: `factor` is not a finite number.

    Returns:
        The paths of the scaled layers.
    """
    if (
        isinstance(factor, bool)
        or not isinstance(factor, (int, float))
        or factor != factor
        or abs(factor) == float("inf")
    ):
        raise ValueError(f"factor must be a finite number, got {factor!r}")
    return init_weights_(model, lambda weight: weight.mul_(factor), select)
