"""`Watch.state_dict()` / `load_state_dict()`: counters, kept steps and device extras, to resume a run.

The format is `STATE`, checked in full before anything is loaded. A state loaded into a watch that has its
modules already is checked against them (paths, parameter names and shapes, unit counts) and applied at once;
otherwise it waits, whole, for the modules of the next `on_fit_start`, which checks it the same way before
the watch changes. A refused state leaves the watch as it was.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

import torch

from .._schema import (
    FLOAT,
    INT,
    Bool,
    Const,
    Either,
    Int,
    ListOf,
    MapOf,
    Optional,
    Record,
    Rule,
    SchemaError,
    Str,
    Tensor,
    check,
    found,
)
from ..results import ACTIVATION_STATS, FIRST_NONFINITE, GRAD_STATS
from ._buffers import Chunk

if TYPE_CHECKING:
    from ._recorder import Recorder
    from ._watch import Watch

__all__ = ["STATE", "apply_pending_state", "check_pending_state", "load_watch_state", "watch_state"]

_VERSION = 2  # 2: histogram ranges as exponents, unit activity as the engine's table keeps it
_COUNTERS = ("_batches", "_optimizer_steps", "_step", "_recorded", "_warned_unobserved")
_OPTIONAL = {"_skipped": list, "_labelled": list}  # added after version 1 was written: absent from older states
_RECORDER = ("dropped", "observed", "forward_order", "backward_order")

_ROWS = ("float64",)  # the kept steps' dtype (`Chunk`)
_TABLE = Record(
    steps=Tensor(INT, shape=("steps",)),
    activations=Tensor(_ROWS, shape=("steps", "modules", len(ACTIVATION_STATS))),
    histograms=Tensor(_ROWS, shape=("steps", "modules", "bins+2")),  # the bins, then below and above a range
    exponents=Tensor(INT, shape=("steps", "modules")),  # each row's range (`hookscope.stats`)
    output_grads=Tensor(_ROWS, shape=("steps", "modules", len(GRAD_STATS))),
    param_grads=Tensor(_ROWS, shape=("steps", "params", len(GRAD_STATS))),
    update_ratios=Tensor(_ROWS, shape=("steps", "params")),
    losses=Tensor(_ROWS, shape=("steps",)),
    has_loss=Bool(),
)
_RECORDER_STATE = Record(
    paths=ListOf(Str(), length="modules"),
    param_names=ListOf(Str(), length="params"),
    dropped=MapOf(Int(min=0)),
    observed=ListOf(Bool(), length="modules"),
    forward_order=ListOf(Int(min=0, below="modules")),
    backward_order=ListOf(Int(min=0, below="modules")),
    units=ListOf(Optional(Tensor(FLOAT, shape=(2, "*"))), length="modules"),  # active and seen values per unit
    first=Optional(Tensor(INT, shape=(2, "modules"))),
    optional={"param_shapes": ListOf(ListOf(Int(min=0)), length="params")},  # absent from older states
)
STATE = Record(
    version=Const(_VERSION, "the Watch.state_dict() version this hookscope reads"),
    batches=Int(min=0),
    optimizer_steps=Int(min=0),
    step=Int(min=-1),
    recorded=Int(min=0),
    warned_unobserved=Bool(),
    first=FIRST_NONFINITE,
    stride=Int(min=1),
    capacity_dropped=Int(min=0),
    table=Optional(_TABLE),
    recorder=Optional(_RECORDER_STATE),
    optional={
        "skipped": ListOf(Int(min=0)),
        "labelled": ListOf(ListOf(Either(Str(), Int(min=0)), length=2)),  # [label, step] pairs
    },
    rules=[Rule("recorder", lambda s: s["table"] is None or s["recorder"] is not None, "is missing (table is there)")],
)
"""The format of `Watch.state_dict()`; `bins` is the watch's `hist_bins`."""


def watch_state(watch: Watch) -> dict[str, Any]:
    """Return the state of `watch`; closes the current step and flushes the device buffers.

    A checkpoint is taken between steps: the step in progress is closed and kept, so a run resumed from this
    state records the next step as the next one (a loss logged after this call for the closed step is dropped).
    """
    recorder = watch._recorder
    if recorder is not None:
        watch.on_batch_end(-1)
        watch._end_step()
    watch._flush()
    table = watch._store.table()
    state: dict[str, Any] = {"version": _VERSION, **{name.lstrip("_"): getattr(watch, name) for name in _COUNTERS}}
    state.update({name.lstrip("_"): list(getattr(watch, name)) for name in _OPTIONAL})
    state.update(first=watch._first, stride=watch._store.stride, capacity_dropped=watch._store.dropped)
    state["table"] = None if table is None else {f.name: getattr(table, f.name) for f in fields(Chunk)}
    state["recorder"] = None if recorder is None else _recorder_state(recorder)
    return state


def _recorder_state(recorder: Recorder) -> dict[str, Any]:
    state: dict[str, Any] = {name: _copy(getattr(recorder, name)) for name in _RECORDER}
    state.update(paths=list(recorder.paths), param_names=list(recorder.param_names))
    state["param_shapes"] = [list(shape) for shape in recorder.param_shapes]
    recorder.buffers.acts.flush()
    state["units"] = recorder.buffers.acts.units.state()
    state["first"] = None if recorder.first is None else recorder.first.cpu().clone()
    return state


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else list(value)


def load_watch_state(watch: Watch, state: dict[str, Any]) -> None:
    """Check `state` in full, then restore it into `watch` (now, or at the next `on_fit_start`).

    Raises:
        ValueError: `state` is not a watch state of this version, does not fit the format (the field is named),
            or was saved for other modules; `watch` is left as it was.
    """
    if not isinstance(state, dict) or state.get("version") != _VERSION:
        raise SchemaError(
            "state",
            "state.version",
            f"must be {_VERSION}: state must be a Watch.state_dict() of version {_VERSION}, got {found(state)}",
        )
    check(STATE, state, bind={"bins": watch.options.hist_bins})
    if watch._recorder is None:
        watch._pending_state = state
        return
    _check_fits(state["recorder"], watch._recorder)
    _apply(watch, state)


def check_pending_state(watch: Watch, recorder: Recorder) -> None:
    """Check that the state waiting in `watch` fits `recorder` (before `on_fit_start` changes anything).

    Raises:
        ValueError: the state was saved for other modules; it is dropped, so the next attach starts afresh.
    """
    state = watch._pending_state
    if state is not None:
        try:
            _check_fits(state["recorder"], recorder)
        except ValueError:
            watch._pending_state = None
            raise


def apply_pending_state(watch: Watch) -> None:
    """Apply the state waiting in `watch` (checked by `check_pending_state`) now that its recorder is set."""
    state, watch._pending_state = watch._pending_state, None
    if state is not None:
        _apply(watch, state)


def _check_fits(saved: dict[str, Any] | None, recorder: Recorder) -> None:
    if saved is None:
        return
    if saved["paths"] != recorder.paths or saved["param_names"] != recorder.param_names:
        raise ValueError(
            f"state must be saved from a watch of the same modules, got paths {saved['paths'][:5]}... for a "
            f"watch of {recorder.paths[:5]}... (select the same modules as the run that saved it)"
        )
    shapes = saved.get("param_shapes")
    current = [list(shape) for shape in recorder.param_shapes]
    if shapes is not None and shapes != current:
        index = next(i for i, (a, b) in enumerate(zip(shapes, current, strict=True)) if a != b)
        raise ValueError(
            f"state must be saved from a model of the same widths, got parameter {saved['param_names'][index]!r} "
            f"of shape {tuple(shapes[index])} for one of shape {tuple(current[index])} (load it into the model "
            "that saved it)"
        )
    slots = recorder.buffers.acts.units.slots
    for path, units, now in zip(saved["paths"], saved["units"], slots, strict=True):
        if units is not None and now is not None and units.shape[-1] != now[1]:
            raise ValueError(
                f"state must be saved from a model of the same widths, got {units.shape[-1]} units for module "
                f"{path!r}, which has {now[1]}"
            )


def _apply(watch: Watch, state: dict[str, Any]) -> None:
    """Restore a checked state that fits (nothing here can refuse it)."""
    for name in _COUNTERS:
        setattr(watch, name, state[name.lstrip("_")])
    for name, make in _OPTIONAL.items():
        setattr(watch, name, make(state.get(name.lstrip("_"), ())))
    watch._first = dict(state["first"])
    table = None if state["table"] is None else Chunk(**state["table"])
    watch._store.restore(table, state["stride"], state["capacity_dropped"])
    recorder, saved = watch._recorder, state["recorder"]
    if recorder is None or saved is None:
        return
    for name in _RECORDER:
        setattr(recorder, name, _copy(saved[name]))
    recorder._ranked = (
        [j in recorder.forward_order for j in range(len(recorder.paths))],
        [j in recorder.backward_order for j in range(len(recorder.paths))],
    )
    device = recorder.buffers.device or _device_of(recorder)
    recorder.buffers.acts.units.load(saved["units"], device)
    if saved["first"] is not None:
        recorder.first = saved["first"].to(device)
        recorder.flags = torch.ones_like(recorder.first, dtype=torch.bool)


def _device_of(recorder: Recorder) -> torch.device:
    for parameter in recorder.params:
        return parameter.device
    return torch.device("cpu")
