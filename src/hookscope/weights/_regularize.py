"""Regularization from selectors: L1/L2 penalties to add to a loss, and decoupled per-layer weight decay."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from .._check import aliases, checked
from ..hooks import register_post_accumulate_grad_hook
from ..hooks._select import Selector
from ._layers import HandleGroup, effective_weight, weight_layers, weight_parameter

__all__ = ["l1_penalty", "l2_penalty", "register_weight_decay"]

_TAGS = ("hookscope.weights", "weight_decay")


def _penalty(model: nn.Module, select: Selector, term: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    terms = [term(effective_weight(module)) for _, module in weight_layers(model, select)]
    if not terms:
        return torch.zeros(())
    device = terms[0].device
    return torch.stack([t.to(device) for t in terms]).sum()


@aliases(layer_names="select")
@checked()
def l1_penalty(model: nn.Module, select: Selector = None) -> torch.Tensor:
    """Return sum |W| over the chosen layers' weights: a differentiable 0-d tensor to add to the loss.

    Accumulated in float32 or wider. Example: `loss = loss + 1e-5 * l1_penalty(model)`.
    """
    return _penalty(model, select, lambda w: w.abs().sum(dtype=_accumulator(w)))


@aliases(layer_names="select")
@checked()
def l2_penalty(model: nn.Module, select: Selector = None) -> torch.Tensor:
    """Return sum W^2 over the chosen layers' weights (no 1/2 factor): a differentiable 0-d tensor for the loss.

    Accumulated in float32 or wider. Example: `loss = loss + 1e-4 * l2_penalty(model, "encoder.**")`.
    """
    return _penalty(model, select, lambda w: w.square().sum(dtype=_accumulator(w)))


def _accumulator(weight: torch.Tensor) -> torch.dtype:
    return torch.float64 if weight.dtype == torch.float64 else torch.float32


@aliases(layer_names="select")
@checked()
def register_weight_decay(
    model: nn.Module,
    weight_decay: float,
    select: Selector = None,
    *,
    lr: float | torch.optim.Optimizer,
) -> HandleGroup:
    """Decay the chosen layers' weights, decoupled from the gradient (as AdamW does): W <- W * (1 - lr * wd).

    The decay runs in a post-accumulate-grad hook on each weight, i.e. once per backward, after its gradient
    is complete (a module backward hook would see partial gradients of shared weights). The gradient was
    computed before the decay, which is AdamW's order. With gradient accumulation over k backward passes per
    step, divide `weight_decay` by k. Weights that do not require grad are left alone.

    Args:
        model: The model.
        weight_decay: The decay rate (>= 0); call again with other layers for per-layer rates.
        select: A hookscope selector; `None` picks every module with a weight.
        lr: The learning rate, or the optimizer whose current `lr` (per parameter group, so schedulers are
            followed) is used.

    Returns:
        A `HandleGroup` whose `remove()` stops the decay.

    Raises:
        ValueError: `weight_decay` is negative, or `lr` is not a positive number or an optimizer.
    """
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)) or not weight_decay >= 0:
        raise ValueError(f"weight_decay must be a number >= 0, got {weight_decay!r}")
    if not isinstance(lr, torch.optim.Optimizer) and (
        isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0
    ):
        raise ValueError(f"lr must be a positive number or the optimizer to read it from, got {lr!r}")
    handles = HandleGroup()
    for path, module in weight_layers(model, select):
        parameter = weight_parameter(module)
        if parameter.requires_grad:
            hook = _decay(float(weight_decay), lr, parameter)
            handle = register_post_accumulate_grad_hook(parameter, hook, owner="weights.decay", path=path, tags=_TAGS)
            handles.append(handle)
    return handles


def _decay(
    weight_decay: float, lr: float | torch.optim.Optimizer, parameter: torch.Tensor
) -> Callable[[torch.Tensor], None]:
    fixed = None if isinstance(lr, torch.optim.Optimizer) else float(lr)
    groups = lr.param_groups if isinstance(lr, torch.optim.Optimizer) else []
    found: list[dict[str, Any]] = []  # the parameter's group, looked up once

    def hook(param: torch.Tensor) -> None:
        if fixed is not None:
            rate: float | torch.Tensor = fixed
        else:
            if not found:
                found.extend(g for g in groups if any(p is param for p in g["params"]))
            rate = found[0]["lr"] if found else 0.0  # not optimized by this optimizer: not decayed either
        with torch.no_grad():
            param.mul_(1 - rate * weight_decay)

    return hook
