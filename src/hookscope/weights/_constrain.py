"""Apply constraints to chosen layers: as a parametrization, after each optimizer step, or before each forward;
and remap checkpoint keys between constrained (parametrized) and plain models.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from .._check import aliases, checked, shown
from ..hooks import HookHandle, normalize_path, register_module_hook, register_optimizer_hook
from ..hooks._select import Selector
from ._constraints import Constraint, MaxNorm, check_constraint
from ._layers import HandleGroup, weight_layers, weight_parameter
from ._nested import is_nested_step

__all__ = [
    "CONSTRAINT_MODES",
    "ConstraintHandle",
    "add_weight_norm_constraint_hook",
    "load_state_dict_remapped",
    "register_constraint",
    "remap_state_dict",
]

CONSTRAINT_MODES = ("parametrize", "step", "forward")
_TAGS = ("hookscope.weights", "constraint")


class _LayerCount:
    """How often one layer's constraint ran and how often it had to correct the weight (on the device)."""

    def __init__(self) -> None:
        self.applications = 0
        self.corrections: torch.Tensor | None = None

    def add(self, needed: torch.Tensor) -> None:
        self.applications += 1
        if self.corrections is None:
            self.corrections = torch.zeros((), dtype=torch.int64, device=needed.device)
        self.corrections += needed.to(self.corrections.device)


class _ConstraintParametrization(nn.Module):
    """`weight = constraint.project(original)`, counting the computations that needed a correction."""

    def __init__(self, constraint: Constraint, count: _LayerCount) -> None:
        super().__init__()
        self.constraint = constraint
        self.count = count

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.count.add(self.constraint.violated(weight))
        return self.constraint.project(weight)

    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        """Store an assigned weight as given (`module.weight = w`); the projection applies when it is read."""
        return weight


class ConstraintHandle:
    """Constraints placed by `register_constraint`: counts per layer, `apply()` now, `remove()` (idempotent).

    Attributes:
        constraint: The constraint.
        mode: `"parametrize"`, `"step"` or `"forward"`.
        layer_names: The constrained layers' paths.
    """

    def __init__(self, constraint: Constraint, mode: str, layers: list[tuple[str, nn.Module]]) -> None:
        self.constraint = constraint
        self.mode = mode
        self.layer_names = [path for path, _ in layers]
        self._modules = {path: weakref.ref(module) for path, module in layers}
        self._counts = {path: _LayerCount() for path, _ in layers}
        self._handles: list[HookHandle] = []
        self._parametrizations: dict[str, _ConstraintParametrization] = {}
        self._removed = False

    @property
    def applications(self) -> dict[str, int]:
        """Path -> how many times the constraint ran on that layer."""
        return {path: count.applications for path, count in self._counts.items()}

    @property
    def corrections(self) -> dict[str, int]:
        """Path -> how many of those runs had to correct the weight (one host sync for all layers)."""
        counts = [c.corrections for c in self._counts.values()]
        present = [c for c in counts if c is not None]
        host = iter(torch.stack([c.cpu() for c in present]).tolist() if present else [])
        return {path: (next(host) if c is not None else 0) for path, c in zip(self._counts, counts, strict=True)}

    def apply(self) -> None:
        """Project every constrained layer's stored weight now (in `"parametrize"` mode: its `original`)."""
        for path in self.layer_names:
            module = self._modules[path]()
            if module is not None:
                self._project(path, module)

    def _project(self, path: str, module: nn.Module) -> None:
        self._counts[path].add(self.constraint.apply_(weight_parameter(module)))

    def remove(self) -> None:
        """Stop constraining; a parametrization is removed leaving the constrained value as the weight."""
        if self._removed:
            return
        self._removed = True
        while self._handles:
            self._handles.pop().remove()
        for path, parametrization in self._parametrizations.items():
            module = self._modules[path]()
            if module is not None:
                _remove_parametrization(module, parametrization)
        self._parametrizations.clear()

    def __enter__(self) -> ConstraintHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "removed" if self._removed else "active"
        return f"ConstraintHandle({self.constraint!r}, mode={self.mode!r}, layers={len(self.layer_names)}, {state})"


def _remove_parametrization(module: nn.Module, parametrization: nn.Module) -> None:
    if not parametrize.is_parametrized(module, "weight"):
        return
    parametrizations: Any = module.parametrizations
    stack = parametrizations["weight"]
    if len(stack) == 1 and stack[0] is parametrization:
        parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
        return
    for index, member in enumerate(stack):
        if member is parametrization:
            del stack[index]
            return


@aliases(layer_names="select")
@checked()
def register_constraint(
    model: nn.Module,
    constraint: Constraint,
    select: Selector = None,
    *,
    mode: str | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> ConstraintHandle:
    """Constrain the weights of the chosen layers.

    Modes: `"step"` projects the stored weights after every `optimizer.step()` (a step post-hook; a step that
    GradScaler skips is not followed by a projection); `"forward"` projects them before every forward of the
    layer (a forward pre-hook); `"parametrize"` registers a `torch.nn.utils.parametrize` parametrization, so
    `module.weight` is always the projection of `parametrizations.weight.original` (gradients flow through the
    projection) and state-dict keys change (see `remap_state_dict`). The default is `"step"` when an optimizer
    is given, else `"forward"`. In-place projections run under `torch.no_grad()`.

    Returns:
        A `ConstraintHandle` with per-layer `applications` and `corrections` counts, `apply()` and `remove()`.

    Raises:
        TypeError: `constraint` is not a `Constraint`, or `optimizer` is not an optimizer.
        ValueError: `mode` is unknown, `"step"` has no optimizer, or a name matches no module.
    """
    constraint = check_constraint(constraint)
    mode = mode if mode is not None else ("step" if optimizer is not None else "forward")
    if mode not in CONSTRAINT_MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, CONSTRAINT_MODES))}, got {mode!r}")
    layers = weight_layers(model, select)
    if not layers:
        weights = [name for name, _ in model.named_parameters() if "weight" in name.rsplit(".", 1)[-1]][:4]
        raise ValueError(
            f"model must have a layer with a `weight` parameter to constrain, got {shown(model)}, which has none"
            + (f" (its weights are named {', '.join(map(repr, weights))}: constrain them in a hook)" if weights else "")
        )
    handle = ConstraintHandle(constraint, mode, layers)
    if mode == "step":
        if optimizer is None:
            raise ValueError("mode 'step' must be given the optimizer=... whose steps it follows, got None")
        hook = _after_step(handle)
        handle._handles.append(register_optimizer_hook(optimizer, "step_post", hook, owner=handle, tags=_TAGS))
    for path, module in layers:
        if mode == "forward":
            pre_hook = _before_forward(handle, path)
            placed = register_module_hook(module, "forward_pre", pre_hook, owner=handle, path=path, tags=_TAGS)
            handle._handles.append(placed)
        elif mode == "parametrize":
            parametrization = _ConstraintParametrization(constraint, handle._counts[path])
            parametrize.register_parametrization(module, "weight", parametrization)
            handle._parametrizations[path] = parametrization
            handle._counts[path] = parametrization.count = _LayerCount()  # registration's own checks not counted
    return handle


# The hooks hold their handle strongly: a constraint stays in force until `remove()`, whether or not the caller
# keeps the handle (as torch's hooks do). The handle holds its modules weakly, so no cycle keeps a model alive.
def _after_step(handle: ConstraintHandle) -> Callable[[torch.optim.Optimizer, Any, Any], None]:
    def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not is_nested_step(optimizer):
            handle.apply()

    return hook


def _before_forward(handle: ConstraintHandle, path: str) -> Callable[[nn.Module, Any], None]:
    def hook(module: nn.Module, args: Any) -> None:
        handle._project(path, module)

    return hook


@aliases(layer_names="select")
@checked()
def add_weight_norm_constraint_hook(model: nn.Module, max_norm: float = 10.0, select: Selector = None) -> HandleGroup:
    """Before each forward of each chosen layer, rescale in place every output unit whose weight row has an L2
    norm above `max_norm` down to `max_norm` (max-norm regularization); other rows are untouched.

    Rows are those of the weight viewed as `(out_features, -1)`. The rescale runs under `torch.no_grad()`.
    For counts of corrections use `register_constraint(model, MaxNorm(max_norm), mode="forward")`.

    Returns:
        One forward pre-hook handle per chosen layer, as a list (a `HandleGroup`: also `remove()` and `with`).

    Raises:
        ValueError: `max_norm` is not a positive number, or a name matches no module.
    """
    constraint = MaxNorm(_max_norm(max_norm))

    def hook(module: nn.Module, args: Any) -> None:
        constraint.apply_(weight_parameter(module))

    return HandleGroup(
        register_module_hook(module, "forward_pre", hook, owner="weights.max_norm", path=path, tags=_TAGS)
        for path, module in weight_layers(model, select)
    )


def _max_norm(max_norm: object) -> float:
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
        raise ValueError(f"max_norm must be a positive number, got {max_norm!r}")
    return float(max_norm)


_PARAMETRIZED = re.compile(r"(^|\.)parametrizations\.([^.]+)\.original$")


def _plain_key(key: str) -> str:
    return _PARAMETRIZED.sub(r"\1\2", normalize_path(key))


@checked()
def remap_state_dict(state_dict: Mapping[str, Any], model: nn.Module) -> dict[str, Any]:
    """Rename `state_dict`'s keys to those of `model`, across parametrizations and wrappers.

    `layer.parametrizations.weight.original` and `layer.weight` are the same key here, as are keys with and
    without DDP's `module.` or compile's `_orig_mod.`; so a checkpoint of a constrained model loads into a plain
    one and back. What moves is the stored tensor: from a parametrized model that is `original`, not the
    projected weight (to export projected weights, call `ConstraintHandle.remove()` first: it leaves the
    projected value as a plain weight).
    Keys with no counterpart are kept as they are, so `load_state_dict` still reports them; parametrizations
    that store several tensors (`original0`, ...) are not remapped.
    """
    targets = {_plain_key(key): key for key in model.state_dict()}
    remapped: dict[str, Any] = {}
    for key, value in state_dict.items():
        remapped[targets.get(_plain_key(key), key)] = value
    return remapped


@checked()
def load_state_dict_remapped(model: nn.Module, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
    """`model.load_state_dict(remap_state_dict(state_dict, model), strict)`; returns what torch returns.

    Raises:
        ValueError: with `strict`, keys are missing or unexpected, or shapes differ (torch's message follows).
    """
    try:
        return model.load_state_dict(remap_state_dict(state_dict, model), strict=strict)
    except RuntimeError as err:
        raise ValueError(
            f"state_dict must fit the {type(model).__name__} after remapping, got {len(state_dict)} keys that do not "
            f"(pass strict=False to load the common ones): {err}"
        ) from None
