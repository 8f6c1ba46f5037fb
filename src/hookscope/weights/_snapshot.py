"""Exact copies of an optimizer's parameters, state and hyperparameters, taken before a step and put back."""

from __future__ import annotations

import copy
from typing import Any

import torch

__all__ = ["OptimizerSnapshot", "optimizer_params"]


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every parameter of `optimizer`, group by group, in order."""
    return [p for group in optimizer.param_groups for p in group["params"]]


class OptimizerSnapshot:
    """Bit-exact copies of an optimizer's parameters, per-parameter state and group hyperparameters.

    `take` reuses the buffers of the previous snapshot where shapes, dtypes and devices match, so a snapshot per
    step allocates nothing after the first. `restore` writes every value back in place and deletes state the
    step created, so the next step computes exactly what it would have without the undone one.

    Group hyperparameters (`lr`, `betas`, ...) are put back only where the step itself changed them (noted by
    `note_step` right after it; torch's optimizers never do): a scheduler's change after the step is kept.
    """

    def __init__(self) -> None:
        self.param_ids: tuple[int, ...] = ()
        self.params: list[torch.Tensor] = []
        self.states: list[dict[str, Any] | None] = []
        self.groups: list[dict[str, Any]] = []
        self.group_changes: list[dict[str, Any]] = []

    def take(self, optimizer: torch.optim.Optimizer) -> None:
        """Copy the parameters, state and hyperparameters of `optimizer` now (no host sync)."""
        params = optimizer_params(optimizer)
        self.params = _copy_list(self.params, params)
        old_states = self.states if len(self.states) == len(params) else [None] * len(params)
        self.states = [_copy_state(old, optimizer.state.get(p)) for old, p in zip(old_states, params, strict=True)]
        self.groups = [_plain_hyperparameters(group) for group in optimizer.param_groups]
        self.group_changes = []
        self.param_ids = tuple(id(p) for p in params)

    def note_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Note which plain (non-tensor) group hyperparameters the step just taken changed or added."""
        self.group_changes = []
        for group, saved in zip(optimizer.param_groups, self.groups, strict=False):
            now = _plain_hyperparameters(group)
            self.group_changes.append({k: saved.get(k, _ADDED) for k, v in now.items() if saved.get(k, _ADDED) != v})

    def restore(self, optimizer: torch.optim.Optimizer) -> None:
        """Write the snapshot back into `optimizer`, its parameters and its state, in place.

        Raises:
            RuntimeError: the optimizer's parameters are not those the snapshot was taken of.
        """
        params = optimizer_params(optimizer)
        if tuple(id(p) for p in params) != self.param_ids:
            raise RuntimeError(
                "optimizer must hold the same parameters as when the step was watched, got different param_groups;"
                " restore before calling add_param_group"
            )
        with torch.no_grad():
            for param, saved in zip(params, self.params, strict=True):
                param.copy_(saved)
        for param, saved_state in zip(params, self.states, strict=True):
            if saved_state is None:
                optimizer.state.pop(param, None)
            else:
                _restore_state(optimizer.state[param], saved_state)
        for group, changes in zip(optimizer.param_groups, self.group_changes, strict=False):
            for key, value in changes.items():
                if value is _ADDED:
                    group.pop(key, None)
                else:
                    group[key] = copy.deepcopy(value)


_ADDED = object()  # marks a group key the step added


def _plain_hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    return {k: copy.deepcopy(v) for k, v in _hyperparameters(group).items() if not isinstance(v, torch.Tensor)}


def _hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k not in ("params", "param_names")}


def _copy_tensor(old: Any, tensor: torch.Tensor) -> torch.Tensor:
    if (
        isinstance(old, torch.Tensor)
        and old.shape == tensor.shape
        and old.dtype == tensor.dtype
        and old.device == tensor.device
        and old.stride() == tensor.stride()
    ):
        with torch.no_grad():
            return old.copy_(tensor)
    return tensor.detach().clone(memory_format=torch.preserve_format)


def _copy_list(old: list[torch.Tensor], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    previous: list[Any] = old if len(old) == len(tensors) else [None] * len(tensors)
    return [_copy_tensor(o, t) for o, t in zip(previous, tensors, strict=True)]


def _copy_state(old: dict[str, Any] | None, state: dict[str, Any] | None) -> dict[str, Any] | None:
    if state is None:
        return None
    old = old or {}
    return {
        key: _copy_tensor(old.get(key), value) if isinstance(value, torch.Tensor) else copy.deepcopy(value)
        for key, value in state.items()
    }


def _restore_state(current: dict[str, Any], saved: dict[str, Any]) -> None:
    for key in [k for k in current if k not in saved]:
        del current[key]
    for key, value in saved.items():
        now = current.get(key)
        if isinstance(value, torch.Tensor):
            if isinstance(now, torch.Tensor) and now.shape == value.shape and now.dtype == value.dtype:
                with torch.no_grad():
                    now.copy_(value)
            else:
                current[key] = value.clone()
        else:
            current[key] = copy.deepcopy(value)
