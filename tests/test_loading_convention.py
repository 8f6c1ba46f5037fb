"""One loading convention: `X.load(path)` on a class returns a new object; on an object it restores the file into it,
in place, as the seed's `load` did (the same as `hookscope.load_state(path, obj)` and `obj.load_state_dict`)."""

from __future__ import annotations

import importlib
import inspect
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import hookscope
from hookscope._loading import class_loader
from hookscope.monitors import Monitor, MonitorPool, OutputMonitor
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
from states import assert_same_state

REDUCERS = {
    "stats": lambda: StatsReducer(near_zero=0.25),
    "histogram": lambda: HistogramReducer(8, range=(-2.0, 2.0)),
    "history": lambda: HistoryReducer(capacity=3),
    "ema": lambda: EMAReducer(0.3),
    "ca": CAReducer,
    "passthrough": PassthroughReducer,
    "quantile": lambda: QuantileReducer([0.1, 0.9]),
    "reservoir": lambda: ReservoirReducer(5),
}


def _pushed(name: str) -> Reducer:
    reducer = REDUCERS[name]()
    for seed in range(4):
        reducer.push(torch.randn(6, generator=torch.Generator().manual_seed(seed)))
    return reducer


@pytest.mark.parametrize("name", sorted(REDUCERS))
def test_reducer_load_is_a_classmethod_building_the_saved_type_and_config(name: str, tmp_path: Path) -> None:
    saved = _pushed(name)
    path = saved.save(tmp_path / "r.safetensors")
    for loader in (Reducer, type(saved)):
        loaded = loader.load(path)
        assert type(loaded) is type(saved) and loaded is not saved
        assert loaded.config() == saved.config()
        assert_same_state(loaded.state_dict(), saved.state_dict())


def test_load_on_an_instance_restores_in_place_as_the_seed_did(tmp_path: Path) -> None:
    reducer = _pushed("stats")
    path = reducer.save(tmp_path / "r.safetensors")
    fresh = StatsReducer(near_zero=0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh.load(path) is None
    assert_same_state(fresh.state_dict(), reducer.state_dict())
    again = StatsReducer(near_zero=0.25)
    hookscope.load_state(path, again)  # the same restore, through the one loading function
    assert_same_state(again.state_dict(), reducer.state_dict())
    with pytest.raises(ValueError, match="near_zero"):
        StatsReducer(near_zero=0.5).load(path)  # another configuration is refused, as load_state_dict refuses it


def test_reducer_load_refuses_another_type_and_foreign_type_names(tmp_path: Path) -> None:
    path = _pushed("histogram").save(tmp_path / "h.safetensors")
    with pytest.raises(ValueError, match="field state.type must be a StatsReducer, got HistogramReducer"):
        StatsReducer.load(path)
    state = _pushed("stats").state_dict()
    state["type"] = "os.system"  # never imported: only hookscope's own reducers are looked up, by name
    foreign = hookscope.save_state(tmp_path / "f.safetensors", state, kind="reducer")
    with pytest.raises(ValueError, match=r"f.safetensors': field state.type must name one of hookscope's reducers"):
        Reducer.load(foreign)
    state = _pushed("stats").state_dict()
    state["config"] = {"near_zero": -1.0}
    bad = hookscope.save_state(tmp_path / "c.safetensors", state, kind="reducer")
    with pytest.raises(ValueError, match="c.safetensors': near_zero must be"):
        Reducer.load(bad)


def test_monitor_and_pool_load_restore_in_place_without_a_warning(tmp_path: Path) -> None:
    layer = nn.Linear(2, 2)
    monitor = OutputMonitor(StatsReducer(), module=layer)
    layer(torch.ones(3, 2))
    path = monitor.save(tmp_path / "m.safetensors")
    restored = OutputMonitor(StatsReducer())
    model = nn.Sequential(nn.Linear(2, 2))
    pool = MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), model)
    model(torch.ones(1, 2))
    pool_path = pool.save(tmp_path / "p.safetensors")
    copy = MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), nn.Sequential(nn.Linear(2, 2)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored.load(path)
        copy.load(pool_path)
    assert restored.counts == monitor.counts and restored.counts["recorded"] == 1
    assert copy["0"].counts == pool["0"].counts
    again = OutputMonitor(StatsReducer())
    hookscope.load_state(path, again)
    assert again.counts == monitor.counts
    monitor.deregister()
    pool.deregister()
    copy.deregister()


IN_PLACE_ONLY = {Monitor, MonitorPool}  # cannot be rebuilt from a file: `load` restores into an existing one


def _public_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    names = ["hookscope"] + [f"hookscope.{m}" for m in ("hooks", "monitors", "reducers", "weights", "callbacks",
                                                        "watch", "results", "summary", "doctor")]  # fmt: skip
    for module_name in names:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value):
                found[f"{module_name}.{name}"] = value
    return found


def test_every_public_load_is_a_class_loader_or_an_in_place_restore() -> None:
    with_load = {name: cls for name, cls in _public_classes().items() if hasattr(cls, "load")}
    assert {"hookscope.StatsReducer", "hookscope.WatchResults"} <= set(with_load)
    for name, cls in with_load.items():
        static = inspect.getattr_static(cls, "load")
        if any(issubclass(cls, old) for old in IN_PLACE_ONLY):
            assert "in place" in (static.__doc__ or ""), name
        else:
            assert isinstance(static, (classmethod, class_loader)), name
