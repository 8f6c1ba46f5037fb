"""How far weights moved from a snapshot or from another model, and their distribution after each forward."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn

from .._check import aliases, checked, shown
from .._errors import closest_names, unknown_name
from ..hooks import named_modules, register_module_hook
from ..hooks._calls import HookErrors
from ..hooks._select import Selector
from ..stats._describe import describe
from ..stats._norms import norm_of, ratio_of_norms
from ..stats._record import STATISTICS, finalize
from ..stats._spec import Spec
from ._layers import HandleGroup, HookData, effective_weight, has_weight, weight_layers
from ._rows import LazyMapping, RowLog

__all__ = [
    "CHANGE_METRICS",
    "STAT_NAMES",
    "add_weight_change_monitor_hook",
    "add_weight_distribution_monitor",
    "compute_weight_changes",
    "weight_distance",
    "weight_statistics",
]

CHANGE_METRICS = ("norm", "relative", "max", "mean", "cosine")
STAT_NAMES = ("mean", "std", "min", "max", "norm", "abs_mean", "zero_fraction")
ZERO_TOLERANCE = 1e-8
_TAGS = ("hookscope.weights",)


@aliases(layer_names="select")
@checked()
def add_weight_change_monitor_hook(model: nn.Module, select: Selector = None) -> HookData:
    """Snapshot the chosen layers' weights now, as the reference that `compute_weight_changes` measures from.

    No hook is needed to measure a change from a snapshot, so `"handles"` is empty; it is there so that every
    `add_*` function returns the same keys. The snapshots are detached copies on the weights' devices.

    Args:
        model: The model.
        select: A hookscope selector (dotted path, glob, list of them, ...); `None` picks every module that
            has a weight of its own.

    Returns:
        A dict (a `HookData`: also `remove()` and `with`) with `"initial_weights"` (path -> tensor),
        `"layer_names"` (list of paths), `"handles"` (empty), `"remove"` (frees the snapshots) and `"reset"`
        (takes a new snapshot of the same layers now).

    Raises:
        ValueError: a name matches no module (the message lists the closest paths).

    Example:
        >>> import torch.nn as nn
        >>> model = nn.Sequential(nn.Linear(2, 2))
        >>> data = add_weight_change_monitor_hook(model)
        >>> compute_weight_changes(model, data)
        {'0': 0.0}
    """
    layers = weight_layers(model, select)

    def reset() -> None:
        data["initial_weights"] = {path: effective_weight(m).detach().clone() for path, m in layers}

    def remove() -> None:
        data["initial_weights"] = None

    data = HookData({"layer_names": [path for path, _ in layers], "handles": []}, remove)
    reset()
    data["reset"] = reset
    return data


@checked()
def compute_weight_changes(model: nn.Module, hook_data: Mapping[str, Any], metric: str = "norm") -> dict[str, float]:
    """Return, per layer, the change of its weight W since the snapshot W0 in `hook_data`.

    Metrics: `"norm"` ||W - W0||_F; `"relative"` ||W - W0|| / ||W0|| (0.0 when both are 0, `inf` when only W0
    is); `"max"` max |W - W0|; `"mean"` mean |W - W0|; `"cosine"` 1 - cos(W, W0) flattened (0.0 when both are
    zero, 1.0 when one is). Computed in float64; one host sync for all layers.

    Raises:
        ValueError: `metric` is unknown, or a snapshotted layer is missing from `model` or changed shape.
        RuntimeError: the snapshots were freed with `hook_data["remove"]()`.
    """
    _check_metric(metric)
    if "layer_names" not in hook_data or "initial_weights" not in hook_data:
        raise ValueError(
            f"hook_data must be the dict returned by add_weight_change_monitor_hook, got {shown(dict(hook_data))}"
        )
    initial = hook_data["initial_weights"]
    if initial is None:
        raise RuntimeError(
            "hook_data has no snapshot: its remove() was called; take a new one with add_weight_change_monitor_hook"
        )
    modules = dict(named_modules(model))
    changes = []
    for path in hook_data["layer_names"]:
        if path not in modules or not has_weight(modules[path]):
            raise ValueError(unknown_name("hook_data['layer_names']", path, modules, what="layer path"))
        changes.append(weight_change(effective_weight(modules[path]), initial[path], metric, path))
    return _to_floats(list(hook_data["layer_names"]), changes)


@aliases(layer_names="select")
@checked()
def weight_distance(
    model: nn.Module, reference: nn.Module, metric: str = "norm", select: Selector = None
) -> dict[str, float]:
    """Return, per layer with a weight, the distance from `reference`'s weight to `model`'s.

    The metrics are those of `compute_weight_changes`, with `reference` in the role of the snapshot W0 (so
    `"relative"` is relative to `reference`). Layers are matched by normalized path (DDP/compile wrappers
    ignored).

    Raises:
        ValueError: `metric` is unknown, a chosen layer is missing from `reference`, or shapes differ.
    """
    _check_metric(metric)
    others = dict(named_modules(reference))
    paths, changes = [], []
    for path, module in weight_layers(model, select):
        other = others.get(path)
        if other is None or not has_weight(other):
            close = closest_names(path, others)
            hint = f" (closest: {', '.join(map(repr, close))})" if close else ""
            raise ValueError(
                f"reference must have the chosen layers of the model, got {shown(reference)}, which has no layer "
                f"{path!r} with a weight{hint}; compare models of the same architecture"
            )
        paths.append(path)
        changes.append(weight_change(effective_weight(module), effective_weight(other), metric, path))
    return _to_floats(paths, changes)


def weight_change(weight: torch.Tensor, reference: torch.Tensor, metric: str, path: str = "") -> torch.Tensor:
    """The change from `reference` to `weight` under `metric`, as a float64 0-d tensor on `weight`'s device."""
    if weight.shape != reference.shape:
        raise ValueError(
            f"layer {path!r} must keep its weight shape {tuple(reference.shape)} to be compared, got "
            f"{tuple(weight.shape)}"
        )
    w = weight.detach().double().flatten()
    w0 = reference.detach().to(w.device, torch.float64).flatten()
    diff = w - w0
    if metric in ("max", "mean"):
        if diff.numel() == 0:
            return torch.zeros((), dtype=torch.float64, device=w.device)
        return diff.abs().amax() if metric == "max" else diff.abs().mean()
    if metric == "cosine":
        return _cosine_distance(w, w0)
    norm = norm_of(diff)[0]
    if metric == "norm":
        return norm
    return ratio_of_norms(norm, norm_of(w0)[0])  # "relative": the update-to-weight ratio of this change


def _cosine_distance(w: torch.Tensor, w0: torch.Tensor) -> torch.Tensor:
    norm, base = torch.linalg.vector_norm(w), torch.linalg.vector_norm(w0)
    both = (norm > 0) & (base > 0)
    cosine = ((w * w0).sum() / torch.where(both, norm * base, torch.ones_like(norm))).clamp(-1.0, 1.0)
    one_zero = torch.ones_like(norm).where((norm > 0) | (base > 0), torch.zeros_like(norm))
    return torch.where(both, 1.0 - cosine, one_zero)


def _check_metric(metric: str) -> None:
    if metric not in CHANGE_METRICS:
        raise ValueError(f"metric must be one of {', '.join(map(repr, CHANGE_METRICS))}, got {metric!r}")


def _to_floats(paths: list[str], values: list[torch.Tensor]) -> dict[str, float]:
    if not values:
        return {}
    host = torch.stack([v.to(values[0].device) for v in values]).tolist()  # one sync for every layer
    return dict(zip(paths, host, strict=True))


@checked()
def weight_statistics(weight: torch.Tensor) -> torch.Tensor:
    """The statistics of `STAT_NAMES`, in that order, as a float64 tensor on `weight`'s device (no host sync).

    Every statistic is the engine's (`hookscope.stats`): `std` has Bessel's correction (0.0 for a one-element
    weight), `norm` is the L2 norm, `abs_mean` the mean of |w|, and `zero_fraction` the near-zero fraction with
    the threshold 1e-8 (|w| <= 1e-8); non-finite entries are left out of all of them.

    Shape:
        any non-empty weight -> `(7,)`.
    """
    spec = Spec(near_zero=ZERO_TOLERANCE)
    values = dict(zip(STATISTICS, finalize(describe(weight.detach(), spec).record).unbind(), strict=True))
    magnitudes = finalize(describe(weight.detach().abs(), spec).record)
    norm = values["rms"] * values["count"].sqrt()
    return torch.stack(
        [*(values[name] for name in ("mean", "std", "min", "max")), norm, magnitudes[0], values["near_zero"]]
    )


@aliases(layer_types="select")
@checked()
def add_weight_distribution_monitor(
    model: nn.Module, select: Selector = (nn.Linear, nn.Conv2d), *, max_history: int = 1000
) -> HookData:
    """Record the statistics of each chosen layer's weight after every forward of that layer.

    A forward hook on every chosen module that has a weight computes `weight_statistics` on the device (no
    host sync in the hook); the values become floats only when `"stats"` or `"history"` is read.
    `std` is the unbiased estimate. Empty weights are skipped.

    Args:
        model: The model.
        select: A hookscope selector (a module type, a tuple of them, a path, a glob, ...); the default picks
            the `nn.Linear` and `nn.Conv2d` layers; `None` picks every module with a weight.
        max_history: How many records to keep per layer; older ones are dropped and counted.

    Returns:
        A dict (a `HookData`: also `remove()` and `with`) with `"stats"` (path -> the latest statistics as
        floats), `"history"` (path -> list of such dicts, oldest first, at most `max_history`), `"dropped"`
        (path -> records dropped), `"layer_names"`, `"handles"`, `"remove"` and `"errors"` (a `HookErrors`:
        failures of the hooks are counted there and warned about once, never raised into the training unless
        `HOOKSCOPE_STRICT=1`).

    Raises:
        TypeError: `select` is of no selector kind.
        ValueError: `max_history` is not a positive int, or `select` chooses no module with a weight.
    """
    if isinstance(max_history, bool) or not isinstance(max_history, int) or max_history < 1:
        raise ValueError(f"max_history must be a positive int, got {max_history!r}")
    layers = _distribution_layers(model, select)
    logs = {path: RowLog(len(STAT_NAMES), max_history, dtype=torch.float64) for path, _ in layers}
    errors = HookErrors("add_weight_distribution_monitor", counter='hook_data["errors"].failures')
    handles = HandleGroup(
        register_module_hook(
            m, "forward", _record_statistics(logs[p]), owner="weights.distribution", path=p, tags=_TAGS, errors=errors
        )
        for p, m in layers
        if effective_weight(m).numel() > 0
    )

    def recorded() -> list[str]:
        return [p for p, log in logs.items() if len(log)]

    items = {
        "stats": LazyMapping(recorded, lambda p: _latest(logs[p])),
        "history": LazyMapping(recorded, lambda p: _history(logs[p])),
        "dropped": LazyMapping(lambda: list(logs), lambda p: logs[p].dropped),
        "layer_names": [path for path, _ in layers],
        "handles": list(handles),
        "errors": errors,
    }
    return HookData(items, handles.remove)


def _distribution_layers(model: nn.Module, select: Selector) -> list[tuple[str, nn.Module]]:
    try:
        return weight_layers(model, select)
    except ValueError as err:
        found = sorted({type(m).__name__ for _, m in named_modules(model) if has_weight(m)})
        raise ValueError(f"{err}; the model's weighted module types are {found}") from None


def _record_statistics(log: RowLog) -> Callable[[nn.Module, Any, Any], None]:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        with torch.no_grad():
            log.append(weight_statistics(effective_weight(module)))

    return hook


def _latest(log: RowLog) -> dict[str, float]:
    row = log.last()
    return {} if row is None else dict(zip(STAT_NAMES, row.tolist(), strict=True))


def _history(log: RowLog) -> list[dict[str, float]]:
    return [dict(zip(STAT_NAMES, row, strict=True)) for row in log.rows().tolist()]
