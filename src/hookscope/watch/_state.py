"""`Watch.state_dict()` / `load_state_dict()`: counters, kept steps and device extras, to resume a run."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

import torch

from ._buffers import Chunk

if TYPE_CHECKING:
    from ._recorder import Recorder
    from ._watch import Watch

__all__ = ["load_watch_state", "watch_state"]

_VERSION = 1
_COUNTERS = ("_batches", "_optimizer_steps", "_step", "_recorded", "_warned_unobserved")
_OPTIONAL = {"_skipped": list, "_labelled": list}  # added after version 1 was written: absent from older states
_RECORDER = ("dropped", "observed", "forward_order", "backward_order", "unit_values")


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
    state["units"] = [None if t is None else t.cpu().clone() for t in recorder.units]
    state["scales"] = [None if s is None else torch.stack(s).cpu() for s in recorder.scales]
    state["first"] = None if recorder.first is None else recorder.first.cpu().clone()
    return state


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else list(value)


def load_watch_state(watch: Watch, state: dict[str, Any]) -> None:
    """Restore `state` into `watch`; the recorder part waits for `on_fit_start` when not attached yet.

    Raises:
        ValueError: `state` is not a watch state of this version, or was saved for other modules.
    """
    if not isinstance(state, dict) or state.get("version") != _VERSION:
        raise ValueError(f"state must be a Watch.state_dict() of version {_VERSION}, got {str(state)[:200]!r}")
    for name in _COUNTERS:
        setattr(watch, name, state[name.lstrip("_")])
    for name, make in _OPTIONAL.items():
        setattr(watch, name, make(state.get(name.lstrip("_"), ())))
    watch._first = dict(state["first"])
    table = None if state["table"] is None else Chunk(**state["table"])
    watch._store.restore(table, int(state["stride"]), int(state["capacity_dropped"]))
    watch._pending_recorder_state = state["recorder"]
    if watch._recorder is not None:
        apply_recorder_state(watch)


def apply_recorder_state(watch: Watch) -> None:
    """Apply a loaded recorder state to the watch's recorder (once its modules are known).

    Raises:
        ValueError: the state was saved for other module paths or parameter names.
    """
    state, recorder = watch._pending_recorder_state, watch._recorder
    if state is None or recorder is None:
        return
    watch._pending_recorder_state = None
    if state["paths"] != recorder.paths or state["param_names"] != recorder.param_names:
        raise ValueError(
            f"state must be saved from a watch of the same modules, got paths {state['paths'][:5]}... for a "
            f"watch of {recorder.paths[:5]}... (select the same modules as the run that saved it)"
        )
    for name in _RECORDER:
        setattr(recorder, name, _copy(state[name]))
    recorder._ranked = (
        [j in recorder.forward_order for j in range(len(recorder.paths))],
        [j in recorder.backward_order for j in range(len(recorder.paths))],
    )
    device = recorder.buffers.device or _device_of(recorder)
    recorder.units = [None if t is None else t.to(device) for t in state["units"]]
    recorder.scales = [None if s is None else (s[0].to(device), s[1].to(device)) for s in state["scales"]]
    if state["first"] is not None:
        recorder.first = state["first"].to(device)
        recorder.flags = torch.ones_like(recorder.first, dtype=torch.bool)


def _device_of(recorder: Recorder) -> torch.device:
    for parameter in recorder.params:
        return parameter.device
    return torch.device("cpu")
