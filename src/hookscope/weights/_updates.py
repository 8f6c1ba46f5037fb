"""Optimizer updates: what each step changed, how big that is next to the weight, and undoing a step."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._check import checked, shown
from ..hooks import normalize_path, register_optimizer_hook
from ..hooks._calls import HookErrors
from ..stats._describe import describe
from ..stats._norms import norm_of, ratio_of_norms
from ..stats._record import STATISTICS, finalize
from ..stats._sample import Sampler
from ..stats._spec import Spec
from ._layers import HandleGroup, HookData
from ._nested import is_nested_step
from ._rows import LazyMapping
from ._snapshot import OptimizerSnapshot, optimizer_params

__all__ = [
    "add_weight_update_monitor_hook",
    "analyze_weight_updates",
    "optimizer_param_names",
    "restore_optimizer_step",
]

_TAGS = ("hookscope.weights",)


def optimizer_param_names(optimizer: torch.optim.Optimizer) -> list[str]:
    """Names of `optimizer`'s parameters in order: its `param_names` (normalized) or `"group{g}.param{i}"`."""
    names = []
    for g, group in enumerate(optimizer.param_groups):
        given = group.get("param_names")
        if given is not None and len(given) == len(group["params"]):
            names += [normalize_path(str(name)) for name in given]
        else:
            names += [f"group{g}.param{i}" for i in range(len(group["params"]))]
    return names


@dataclass
class _Record:
    step: int
    names: tuple[str, ...]
    values: torch.Tensor  # (2, P): ratios, then update norms, float32, on the device
    host: list[list[float]] | None = None


class _UpdateTracker:
    """The state behind `add_weight_update_monitor_hook`; its step hooks keep everything on the device."""

    def __init__(self, optimizer: torch.optim.Optimizer, log_interval: int, data: dict[str, Any]) -> None:
        self.optimizer = weakref.ref(optimizer)
        self.log_interval = log_interval
        self.data = data
        self.snapshot = OptimizerSnapshot()
        self.updates: list[torch.Tensor] = []
        self.records: list[_Record] = []
        self.restorable = False
        self.sampler = Sampler()

    def before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if is_nested_step(optimizer):
            return
        self.restorable = False  # the snapshot of the previous step is about to be overwritten
        self.snapshot.take(optimizer)

    def after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if is_nested_step(optimizer):
            return
        self.snapshot.note_step(optimizer)
        params = optimizer_params(optimizer)
        names = tuple(optimizer_param_names(optimizer))
        with torch.no_grad():
            pairs = zip(self._old_updates(params), params, self.snapshot.params, strict=True)
            self.updates = [_subtract(old, after, before) for old, after, before in pairs]
        self.data["step"] += 1
        self.data["last_updates"] = dict(zip(names, self.updates, strict=True))
        self.restorable = True
        if (self.data["step"] - 1) % self.log_interval == 0:
            self.records.append(_Record(self.data["step"], names, self._norms(params)))

    def _old_updates(self, params: list[torch.Tensor]) -> list[torch.Tensor | None]:
        return list(self.updates) if len(self.updates) == len(params) else [None] * len(params)

    def _norms(self, params: list[torch.Tensor]) -> torch.Tensor:
        if not params:
            return torch.zeros(2, 0)
        device = params[0].device
        update_norms = torch.stack([norm_of(u, self.sampler)[0].to(device) for u in self.updates])
        weight_norms = torch.stack([norm_of(p.detach(), self.sampler)[0].to(device) for p in params])
        return torch.stack([ratio_of_norms(update_norms, weight_norms), update_norms]).float()

    def undo(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.restorable:
            raise RuntimeError(
                "restore_optimizer_step has nothing to restore: no step was watched since the last restore "
                "(or no step yet); it undoes only the most recent optimizer.step()"
            )
        self.snapshot.restore(optimizer)
        if self.records and self.records[-1].step == self.data["step"]:
            self.records.pop()
        self.data["step"] -= 1
        self.data["last_updates"] = {}
        self.updates = []
        self.restorable = False

    def column(self, name: str, row: int) -> list[float]:
        self._to_host()
        out = []
        for record in self.records:
            if name in record.names and record.host is not None:
                out.append(record.host[row][record.names.index(name)])
        return out

    def names(self) -> list[str]:
        seen: dict[str, None] = {}
        for record in self.records:
            seen.update(dict.fromkeys(record.names))
        return list(seen)

    def _to_host(self) -> None:
        pending = [r for r in self.records if r.host is None]
        if not pending:
            return
        values = [r.values for r in pending]
        if len({tuple(v.shape) for v in values}) == 1:
            hosts = torch.stack(values).tolist()  # one sync for every pending record
        else:
            hosts = [v.tolist() for v in values]
        for record, host in zip(pending, hosts, strict=True):
            record.host = host


def _subtract(out: torch.Tensor | None, after: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    if out is not None and out.shape == after.shape and out.dtype == after.dtype and out.device == after.device:
        return torch.sub(after.detach(), before, out=out)
    return after.detach() - before


@checked()
def add_weight_update_monitor_hook(optimizer: torch.optim.Optimizer, log_interval: int = 10) -> HookData:
    """Watch every `optimizer.step()`: the update of each parameter, and its size every `log_interval` steps.

    A step pre-hook copies the parameters and the optimizer state (exactly, into reused buffers: it costs one
    copy of both per step); a step post-hook computes each update dW = W_after - W_before, every step. On steps
    1, 1 + log_interval, ..., the ratio ||dW|| / ||W_after|| and ||dW|| are appended, computed on the device;
    they become floats when read. The copies also let `restore_optimizer_step` undo the latest step.

    Returns:
        A dict (a `HookData`: also `remove()` and `with`) with `"update_history"` (name -> list of
        update-to-weight ratios), `"update_norms"` (name -> list of ||dW||), `"step"` (steps watched),
        `"last_updates"` (name -> dW of the latest step, on the device), `"param_names"`, `"handles"`, `"remove"`
        and `"errors"` (a `HookErrors`: failures of the hooks are counted there and warned about once, never
        raised into the training unless `HOOKSCOPE_STRICT=1`). Names are the optimizer's `param_names` when it
        was built from `model.named_parameters()`, else `"group{g}.param{i}"`.

    Raises:
        TypeError: `optimizer` is not a `torch.optim.Optimizer`.
        ValueError: `log_interval` is not a positive int.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(log_interval, bool) or not isinstance(log_interval, int) or log_interval < 1:
        raise ValueError(f"log_interval must be an int >= 1, got {log_interval!r}")
    handles = HandleGroup()
    data = HookData({"step": 0, "last_updates": {}, "param_names": optimizer_param_names(optimizer)}, handles.remove)
    tracker = _UpdateTracker(optimizer, log_interval, data)
    errors = HookErrors("add_weight_update_monitor_hook", counter='hook_data["errors"].failures')
    for kind, hook in (("step_pre", tracker.before_step), ("step_post", tracker.after_step)):
        handles.append(register_optimizer_hook(optimizer, kind, hook, owner=tracker, tags=_TAGS, errors=errors))
    data["update_history"] = LazyMapping(tracker.names, lambda name: tracker.column(name, 0))
    data["update_norms"] = LazyMapping(tracker.names, lambda name: tracker.column(name, 1))
    data.update(handles=list(handles), errors=errors, _tracker=tracker)
    return data


@checked()
def restore_optimizer_step(optimizer: torch.optim.Optimizer, hook_data: Mapping[str, Any]) -> None:
    """Undo the most recent `optimizer.step()` watched by `hook_data`, bit for bit.

    Every parameter and the optimizer's state (momentum buffers, Adam moments, step counts) go back to what
    they were before that step, so the next step is exactly what it would have been. Group hyperparameters go
    back only where the step itself changed them, so an LR scheduler's change made after the step is kept.
    `hook_data["step"]` goes back by one and the records of the undone step are removed. Only one step can be
    undone. The gradients are left as they are.

    Raises:
        ValueError: `hook_data` was not returned by `add_weight_update_monitor_hook` for this optimizer.
        RuntimeError: there is nothing to restore (no step yet, or it was already restored).
    """
    tracker = hook_data.get("_tracker")
    if not isinstance(tracker, _UpdateTracker):
        raise ValueError(
            f"hook_data must be the dict returned by add_weight_update_monitor_hook, got {shown(dict(hook_data))}"
        )
    if tracker.optimizer() is not optimizer:
        raise ValueError("optimizer must be the one hook_data watches, got a different optimizer")
    tracker.undo(optimizer)


@checked()
def analyze_weight_updates(
    update_history: Mapping[str, Sequence[float] | torch.Tensor], window_size: int = 10
) -> dict[str, dict[str, float]]:
    """Summarize, per parameter, its last `window_size` records (e.g. the update-to-weight ratios).

    Returns `mean`, `std` (Bessel's correction, 0.0 for one record: `hookscope.stats`' definition), `min`, `max`
    (of the finite records), `last` and `trend` (the least-squares slope per record; 0.0 for one record), in
    float64. Parameters with no records are left out.

    Raises:
        ValueError: `window_size` is not a positive int.
    """
    if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise ValueError(f"window_size must be an int >= 1, got {window_size!r}")
    summary = {}
    for name, records in update_history.items():
        values = torch.as_tensor(list(records) if not isinstance(records, torch.Tensor) else records)
        values = values.detach().flatten().double().cpu()[-window_size:]
        if values.numel():
            summary[name] = _window_summary(values)
    return summary


def _window_summary(values: torch.Tensor) -> dict[str, float]:
    steps = torch.arange(values.numel(), dtype=torch.float64)
    centred = steps - steps.mean()
    denominator = (centred * centred).sum()
    trend = (centred * (values - values.mean())).sum() / denominator if values.numel() > 1 else values.new_zeros(())
    described = dict(zip(STATISTICS, finalize(describe(values, Spec()).record).tolist(), strict=True))
    summary = {name: described[name] for name in ("mean", "std", "min", "max")}
    return {**summary, "last": float(values[-1]), "trend": float(trend)}
