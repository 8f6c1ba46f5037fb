"""Every saved state kind, fuzzed over its schema: each field of a valid file dropped, retyped, reshaped,
resized, given an unknown key or a wrong version must be refused with a `ValueError` that names the file and the
field, leaving the object as it was and still usable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_fuzz import Mutation, is_about, mutations

from hookscope import ActivationStats, MonitorPool, load_state, save_state, watch
from hookscope._schema import Field, MapOf, Record
from hookscope.callbacks import _activation_stats as stats_format
from hookscope.monitors import OutputMonitor
from hookscope.monitors import _pool as pool_format
from hookscope.reducers import (
    CAReducer,
    EMAReducer,
    HistogramReducer,
    HistoryReducer,
    PassthroughReducer,
    QuantileReducer,
    Reducer,
    ReservoirReducer,
    StatsReducer,
)
from hookscope.watch import _state
from hookscope.weights import UpdateRatioMonitor, _ratio


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _batch() -> torch.Tensor:
    x = torch.randn(8, 3)
    x[0, 0] = float("nan") if torch.rand(()) < 0.3 else x[0, 0]
    return x


def _train(model: nn.Module, optimizer: torch.optim.Optimizer | None, steps: int, log: Any = None) -> None:
    for _ in range(steps):
        loss = model(torch.randn(8, 3)).pow(2).mean()
        loss.backward()
        if log is not None:
            log.log_loss(loss)
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()


@dataclass
class Kind:
    """A stateful object with some state, its whole format (parts resolved), how its files load, a use."""

    name: str
    target: Any
    schema: Field
    file_kind: str
    load: Callable[[Any, Path], None]
    use: Callable[[Any], None]
    keep: tuple[Any, ...] = ()  # what must stay alive (the model, the optimizer)


def _reducer(reducer: Reducer, shape: tuple[int, ...] = (6,)) -> Kind:
    for _ in range(3):
        reducer.push(torch.randn(shape))

    def use(r: Any) -> None:
        pushes = r.pushes
        r.push(torch.randn(shape))
        assert r.pushes == pushes + 1 and r.peek() is not None

    return Kind(type(reducer).__name__, reducer, reducer.state_schema(), "reducer", lambda r, p: load_state(p, r), use)


def _monitor_schema(monitor: OutputMonitor) -> Record:
    return Record({**monitor.state_schema().fields, "reducer": monitor.reducer.state_schema()})


def _monitor() -> Kind:
    model = _mlp()
    monitor = OutputMonitor(HistogramReducer(8), model[0])
    model(torch.randn(8, 3))

    def use(m: Any) -> None:
        recorded = m.counts["recorded"]
        model(torch.randn(8, 3))
        assert m.counts["recorded"] == recorded + 1

    return Kind(
        "OutputMonitor", monitor, _monitor_schema(monitor), "monitor", lambda m, p: load_state(p, m), use, (model,)
    )


def _pool() -> Kind:
    model = _mlp()
    pool = MonitorPool(OutputMonitor.partialconstructor(ReservoirReducer(5)), model)
    model(torch.randn(8, 3))
    first = pool["0"]
    assert isinstance(first, OutputMonitor)  # every monitor of the pool has its type and reducer configuration
    schema = Record(type=pool_format.STATE.fields["type"], monitors=MapOf(_monitor_schema(first)))

    def use(p: Any) -> None:
        model(torch.randn(8, 3))
        assert all(m.counts["recorded"] == 2 for m in p.values())

    return Kind("MonitorPool", pool, schema, "monitor_pool", lambda p, f: load_state(f, p), use, (model,))


def _watch() -> Kind:
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watcher = watch(model, optimizer, hist_bins=8)
    watcher.attach()  # detached when the test's objects are freed
    _train(model, optimizer, 3, watcher)

    def use(w: Any) -> None:
        steps = w.results().num_steps
        _train(model, optimizer, 2, w)  # a step is in the results once its optimizer step is done
        assert w.results().steps.tolist() == list(range(steps + 2))

    return Kind("Watch", watcher, _state.STATE, "state", lambda w, p: load_state(p, w), use, (model, optimizer))


def _activation_stats() -> Kind:
    model = _mlp()
    stats = ActivationStats(with_hist=True, hist_bins=8)
    with stats.attach(model):
        _train(model, None, 3)

    def use(s: Any) -> None:
        assert len(s.stats) == 3 and len(s.stats[0]) == 2
        with s.attach(model):
            _train(model, None, 2)
        assert len(s.stats) == 2

    kind = Kind("ActivationStats", stats, stats_format.STATE, "state", lambda s, p: load_state(p, s), use)
    kind.keep = (model,)
    return kind


def _ratio_monitor() -> Kind:
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = UpdateRatioMonitor(capacity=4).attach(model, optimizer)
    _train(model, optimizer, 3)
    schema = _ratio.STATE

    def use(m: Any) -> None:
        steps = m.steps
        _train(model, optimizer, 1)
        assert m.steps == steps + 1

    return Kind("UpdateRatioMonitor", monitor, schema, "state", lambda m, p: load_state(p, m), use, (model, optimizer))


KINDS: dict[str, Callable[[], Kind]] = {
    "StatsReducer": lambda: _reducer(StatsReducer()),
    "HistogramReducer": lambda: _reducer(HistogramReducer(8)),
    "HistogramReducer(range)": lambda: _reducer(HistogramReducer(4, range=(-1.0, 1.0))),
    "EMAReducer": lambda: _reducer(EMAReducer(0.5)),
    "CAReducer": lambda: _reducer(CAReducer()),
    "HistoryReducer": lambda: _reducer(HistoryReducer(capacity=2)),
    "PassthroughReducer": lambda: _reducer(PassthroughReducer()),
    "ReservoirReducer": lambda: _reducer(ReservoirReducer(4)),
    "QuantileReducer": lambda: _reducer(QuantileReducer(0.5, capacity=4)),
    "OutputMonitor": _monitor,
    "MonitorPool": _pool,
    "Watch": _watch,
    "ActivationStats": _activation_stats,
    "UpdateRatioMonitor": _ratio_monitor,
}


def same(a: Any, b: Any) -> bool:
    """Deep equality of states: tensors by value (NaN equal to NaN), containers by content."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(((a == b) | (a.isnan() & b.isnan()) if a.is_floating_point() else (a == b)).all())
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def refuse(kind: Kind, state: dict[str, Any], changes: list[Mutation], path: Path) -> None:
    """Save `state` changed by `changes`, load it, and check the refusal and that nothing changed."""
    bad = state
    for change in changes:
        bad = change.apply(bad)
    save_state(path, bad, kind=kind.file_kind)
    with pytest.raises(ValueError) as refused:
        kind.load(kind.target, path)
    message = str(refused.value)
    assert f"file {str(path)!r}" in message, message
    assert any(is_about(refused.value, change) for change in changes), (
        [(c.kind, c.field) for c in changes],
        message,
    )
    assert same(kind.target.state_dict(), state), f"{kind.name} changed by a refused load ({changes[0].kind})"


FIELDS_FUZZED: dict[str, set[str]] = {}


@pytest.mark.parametrize("name", list(KINDS))
def test_every_field_of_every_state_kind_is_checked_before_anything_is_loaded(name: str, tmp_path: Path) -> None:
    kind = KINDS[name]()
    state = kind.target.state_dict()
    found = list(mutations(kind.schema, state))
    kinds_of_change = {m.kind for m in found}
    assert {"dropped", "extra key", "wrong JSON type"} <= kinds_of_change, kinds_of_change
    for change in found:
        refuse(kind, state, [change], tmp_path / "bad.safetensors")
    FIELDS_FUZZED[name] = {m.field for m in found}
    save_state(tmp_path / "good.safetensors", state, kind=kind.file_kind)
    kind.load(kind.target, tmp_path / "good.safetensors")  # the valid file still loads
    assert same(kind.target.state_dict(), state)
    kind.use(kind.target)  # and the object still works


_BUILT: dict[str, tuple[Kind, dict[str, Any], list[Mutation]]] = {}


def _built(name: str) -> tuple[Kind, dict[str, Any], list[Mutation]]:
    if name not in _BUILT:
        kind = KINDS[name]()
        state = kind.target.state_dict()
        _BUILT[name] = (kind, state, list(mutations(kind.schema, state)))
    return _BUILT[name]


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_stacked_random_mutations_are_refused_and_leave_the_object_as_it_was(
    data: st.DataObject, tmp_path: Path
) -> None:
    name = data.draw(st.sampled_from(sorted(KINDS)), label="kind")
    kind, state, found = _built(name)
    changes = data.draw(st.lists(st.sampled_from(found), min_size=1, max_size=3, unique_by=id), label="changes")
    try:
        changed = state
        for change in changes:
            changed = change.apply(changed)
    except (KeyError, IndexError, TypeError, AttributeError):
        return  # an earlier change removed or replaced what a later one edits: not a document
    refuse(kind, state, changes, tmp_path / "stacked.safetensors")
