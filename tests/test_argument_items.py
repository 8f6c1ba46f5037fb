"""Entry points that accepted garbage or failed deep inside (issue 15), each with the error it now gives."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch
import torch.nn as nn

import hookscope
from hookscope import (
    MonitorPool,
    ReservoirReducer,
    StatsReducer,
    analyze_weight_updates,
    list_hooks,
    restore_optimizer_step,
    select_modules,
    watch,
)
from hookscope.hooks import register_module_hook
from hookscope.monitors import DifferenceMonitor, OutputMonitor, ParameterGradMonitor
from hookscope.weights import MaxNorm, register_constraint


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def test_a_path_where_the_model_goes_is_a_type_error_naming_the_model() -> None:
    with pytest.raises(TypeError, match=r"model must be an nn.Module, got 'x'; pass the module itself"):
        select_modules("x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"model must be an nn.Module or None, got 'x'"):
        list_hooks("x")  # type: ignore[arg-type]


def test_a_hook_that_is_not_callable_or_takes_the_wrong_arguments_is_refused_when_registered() -> None:
    model = _mlp()
    with pytest.raises(TypeError, match="hook must be a callable, got 5; pass the function itself"):
        register_module_hook(model[0], "forward", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"hook must be a callable .* with signature \(module\); it must take 3"):
        register_module_hook(model[0], "forward", lambda module: None)
    with pytest.raises(TypeError, match=r"with signature \(module, args, output\); it must take 4"):
        register_module_hook(model[0], "forward", lambda module, args, output: None, with_kwargs=True)
    assert list_hooks(model) == [] and model(torch.ones(1, 3)).shape == (1, 2)  # nothing was left behind


def test_a_selector_that_matches_nothing_is_an_error_that_lists_what_is_there() -> None:
    with pytest.raises(
        ValueError, match=r"select must match at least one module of the Sequential, got <class .*Conv2d"
    ):
        watch(_mlp(), select=nn.Conv2d)
    with pytest.raises(ValueError, match=r"matches none; the model has '0' \(Linear\), '1' \(ReLU\), '2' \(Linear\)"):
        select_modules(_mlp(), [nn.Conv2d, nn.LSTM])
    assert select_modules(_mlp(), lambda path, module: False) == []  # a rank may watch nothing (E2)
    assert select_modules(nn.Sequential(nn.ReLU())) == []  # None (the default) may choose nothing


def test_constraining_a_model_without_weight_parameters_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"model must have a layer with a `weight` parameter to constrain, got LSTM"):
        register_constraint(nn.LSTM(3, 4), MaxNorm(1.0))
    with pytest.raises(ValueError, match=r"its weights are named 'weight_ih_l0', 'weight_hh_l0'"):
        register_constraint(nn.LSTM(3, 4), MaxNorm(1.0))


def test_weight_update_helpers_name_the_argument_instead_of_failing_inside() -> None:
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"hook_data must be a mapping of str to Any, got \[\]"):
        restore_optimizer_step(optimizer, [])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"update_history must be a mapping of str to .*, got Sequential\("):
        analyze_weight_updates(model)  # type: ignore[arg-type]


def test_a_nan_quantile_level_is_the_documented_value_error() -> None:
    reservoir = ReservoirReducer(8)
    reservoir.push(torch.randn(20))
    with pytest.raises(ValueError, match=r"q must be in \[0, 1\] \(every level\), got nan"):
        reservoir.quantile(math.nan)


@pytest.mark.parametrize(
    "duplicate", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))], ids=["deepcopy", "pickle"]
)
def test_a_copied_monitor_is_an_unattached_monitor_with_the_same_state(duplicate: object) -> None:
    model = _mlp()
    monitors = [
        OutputMonitor(StatsReducer(), model[0]),
        DifferenceMonitor(StatsReducer(), "weight", model[0]),
        ParameterGradMonitor(StatsReducer(), "weight", model[0]),
    ]
    model(torch.randn(5, 3)).sum().backward()
    for monitor in monitors:
        twin = duplicate(monitor)  # type: ignore[operator]
        assert not twin.is_registered and twin.module is None
        assert twin.counts == monitor.counts and twin.counts["recorded"] == 1
        torch.testing.assert_close(twin.peek().mean, monitor.peek().mean)
        other = _mlp()
        twin.register(other[0])  # the copy works on a model of its own
        other(torch.randn(2, 3)).sum().backward()
        assert twin.counts["recorded"] == 2 and monitor.counts["recorded"] == 1
    model(torch.randn(5, 3)).sum().backward()
    assert all(m.counts["recorded"] == 2 for m in monitors)  # the originals kept recording


def test_a_copied_pool_is_unregistered_with_the_same_state() -> None:
    model = _mlp()
    pool = MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), model)
    model(torch.randn(5, 3))
    for duplicate in (copy.deepcopy, lambda p: pickle.loads(pickle.dumps(p))):
        twin = duplicate(pool)
        before = int(pool["2"].peek().count)
        assert not twin.is_registered and twin.model is None and sorted(twin) == ["0", "2"]
        assert int(twin["2"].peek().count) == before
        twin.register(model)  # re-attached to the same model: both record
        model(torch.randn(1, 3))
        assert int(twin["2"].peek().count) == int(pool["2"].peek().count) == before + 2
        twin.deregister()


def test_every_check_message_names_the_argument_the_value_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"every must be a positive int, got 0"):
        hookscope.Watch(every=0)
    with pytest.raises(TypeError, match=r"groups must be a list of str, got 'activations'; wrap a single name"):
        hookscope.Watch(groups="activations")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"reducer must be a Reducer, got <class .*StatsReducer.*; pass an instance"):
        OutputMonitor(StatsReducer)  # type: ignore[arg-type]
