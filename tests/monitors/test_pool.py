"""MonitorPool and persistence: selection by path, one reducer each, and save/load that resumes exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from hookscope import load_state
from hookscope.hooks import scope
from hookscope.monitors import (
    DifferenceMonitor,
    MonitorPool,
    OutputGradMonitor,
    OutputMonitor,
    ParameterGradMonitor,
    StateMonitor,
)
from hookscope.reducers import HistogramReducer, HistoryReducer, ReservoirReducer, StatsReducer
from states import assert_same_state


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 4), nn.Tanh()), nn.Linear(4, 2))


class Wrapper(nn.Module):
    """Stands for DDP: the model sits under `module.`."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


Wrapper.__name__ = "DistributedDataParallel"


def test_pool_picks_modules_with_parameters_by_default_each_with_its_own_reducer() -> None:
    model, x = _model(), torch.randn(5, 3)
    with MonitorPool(OutputMonitor.partialconstructor(HistoryReducer()), model) as pool:
        model(x)
    assert list(pool) == ["0", "2.0", "3"]
    assert len({id(m.reducer) for m in pool.values()}) == 3
    torch.testing.assert_close(pool["0"].peek(), model[0](x).detach())
    assert all(monitor.path == path for path, monitor in pool.items())
    assert not pool.is_registered


def test_pool_selector_and_attr_reach_the_constructor() -> None:
    model = _model()
    pool = MonitorPool(ParameterGradMonitor.partialconstructor(StatsReducer()), model, select="**.0", attr="bias")
    model(torch.randn(5, 3)).sum().backward()
    assert list(pool) == ["0", "2.0"]
    stats = pool["2.0"].peek()
    assert int(stats.count) == 4
    assert stats.mean.item() == pytest.approx(model[2][0].bias.grad.double().mean().item())
    pool.deregister()


def test_pool_keys_are_normalized_across_wrappers() -> None:
    model = _model()
    plain = MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), model)
    wrapped = MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), Wrapper(model))
    assert list(plain) == list(wrapped)
    plain.deregister()
    wrapped.deregister()


def test_pool_lookup_of_an_unknown_path_lists_the_closest() -> None:
    pool = MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), _model())
    with pytest.raises(KeyError, match=r"path must be a monitored module path, got '2.1'; closest: '2.0'"):
        pool["2.1"]
    pool.deregister()


def test_pool_registration_failing_halfway_leaves_no_hooks() -> None:
    model = _model()
    with pytest.raises(ValueError, match="attr must name an attribute of the ReLU"):
        MonitorPool(StateMonitor.partialconstructor(StatsReducer()), model, select=["0", "1"], attr="weight")
    assert all(len(m._forward_hooks) == 0 for m in model.modules())


def test_pool_inside_a_scope_is_removed_with_it() -> None:
    model = _model()
    with scope():
        pool = MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), model)
        assert pool.is_registered
    assert not pool.is_registered and all(len(m._forward_hooks) == 0 for m in model.modules())


def test_pool_re_registers_on_the_same_model_and_carries_state_to_a_new_one() -> None:
    model, x = _model(), torch.randn(2, 3)
    pool = MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), model)
    model(x)
    pool.deregister()
    pool.register()
    model(x)
    pool.register(_model())
    assert int(pool["3"].peek().count) == 2 * 2 * 2 and pool["3"].module is not model[3]
    pool.deregister()


def _train(model: nn.Module, steps: range, sink: list[torch.Tensor]) -> None:
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randn(6, 3, generator=generator) for _ in range(12)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # stateless: a fresh one resumes exactly
    for step in steps:
        model.train(step % 3 != 2)
        optimizer.zero_grad()
        loss = model(batches[step][: 6 - step % 2]).pow(2).mean()
        if model.training:
            loss.backward()
            optimizer.step()
        sink.append(loss.detach())


CONSTRUCTORS = {
    "stats_output": (OutputMonitor.partialconstructor(StatsReducer(), eval_update=False), ""),
    "history_grad": (OutputGradMonitor.partialconstructor(HistoryReducer(capacity=4)), ""),
    "reservoir_param": (ParameterGradMonitor.partialconstructor(ReservoirReducer(capacity=5)), "weight"),
    "histogram_state": (StateMonitor.partialconstructor(HistogramReducer(bins=8)), "weight"),
    "difference": (DifferenceMonitor.partialconstructor(HistoryReducer()), "weight"),
}


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
def test_save_and_load_resume_exactly_where_a_run_stopped(name: str, tmp_path: Path) -> None:
    constructor, attr = CONSTRUCTORS[name]
    straight_model, sink = _model(), []
    straight = MonitorPool(constructor, straight_model, attr=attr)
    _train(straight_model, range(12), sink)

    first_model = _model()
    first = MonitorPool(constructor, first_model, attr=attr)
    _train(first_model, range(7), sink)
    path = first.save(tmp_path / "pool.safetensors")
    first.deregister()

    resumed_model = _model()
    resumed_model.load_state_dict(first_model.state_dict())
    resumed = MonitorPool(constructor, resumed_model, attr=attr)
    load_state(path, resumed)
    _train(resumed_model, range(7, 12), sink)

    for key in straight:
        assert resumed[key].counts == straight[key].counts
        assert resumed[key].reducer.pushes == straight[key].reducer.pushes
        expected, got = straight[key].reducer.state_dict(), resumed[key].reducer.state_dict()
        assert_same_state(got["state"], expected["state"])
    straight.deregister()
    resumed.deregister()


def test_a_single_monitor_saves_and_loads(tmp_path: Path) -> None:
    layer = nn.Linear(2, 2)
    monitor = OutputMonitor(StatsReducer(), module=layer)
    layer(torch.ones(3, 2))
    path = monitor.save(tmp_path / "monitor.safetensors")
    restored = OutputMonitor(StatsReducer())
    load_state(path, restored)
    assert restored.counts == monitor.counts and int(restored.peek().count) == 6
    with pytest.raises(
        ValueError,
        match="monitor.safetensors': field state.type must come from a InputMonitor, got one from 'OutputMonitor'",
    ):
        from hookscope.monitors import InputMonitor

        load_state(path, InputMonitor(StatsReducer()))
    with pytest.raises(ValueError, match="must hold hookscope data of kind 'monitor_pool', found 'monitor'"):
        load_state(path, MonitorPool(OutputMonitor.partialconstructor(StatsReducer())))
    monitor.deregister()


def test_strict_loading_lists_missing_and_unexpected_paths() -> None:
    model = _model()
    pool = MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), model)
    state = pool.state_dict()
    state["monitors"]["9"] = state["monitors"].pop("0")
    with pytest.raises(ValueError, match=r"missing \['0'\], unexpected \['9'\]"):
        pool.load_state_dict(state)
    pool.load_state_dict(state, strict=False)
    pool.deregister()


def test_constructor_must_be_callable_and_return_a_monitor() -> None:
    with pytest.raises(TypeError, match="constructor must be a callable, got None"):
        MonitorPool(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="constructor must return a Monitor, got str for '0'"):
        MonitorPool(lambda attr, module: "monitor", _model())  # type: ignore[arg-type,return-value]
    with pytest.raises(RuntimeError, match=r"MonitorPool.register\(\) needs a model"):
        MonitorPool(OutputMonitor.partialconstructor(StatsReducer())).register()
