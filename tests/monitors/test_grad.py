"""OutputGradMonitor and ParameterGradMonitor against gradients torch computes with retain_grad and .grad."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from hookscope.monitors import OutputGradMonitor, ParameterGradMonitor
from hookscope.reducers import HistoryReducer, StatsReducer


def test_output_gradients_match_retain_grad() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    x = torch.randn(5, 3)
    with OutputGradMonitor(HistoryReducer(), module=model[0]) as monitor:
        hidden = model[0](x)
        hidden.retain_grad()
        model[2](model[1](hidden)).pow(2).sum().backward()
    assert hidden.grad is not None
    torch.testing.assert_close(monitor.peek(), hidden.grad)


def test_in_place_op_after_the_module_is_fine_and_gradients_are_unchanged() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True), nn.Linear(3, 1))
    x = torch.randn(4, 3)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad()
    with OutputGradMonitor(StatsReducer(), module=model[0]) as monitor:
        model(x).sum().backward()
    assert int(monitor.peek().count) == 12
    for parameter, grad in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(parameter.grad, grad)


def test_a_module_called_three_times_records_three_gradients_last_call_first() -> None:
    relu = nn.ReLU()
    scales = (1.0, 2.0, 3.0)
    x = torch.randn(4, requires_grad=True)
    with OutputGradMonitor(HistoryReducer(), module=relu) as monitor:
        outputs = []
        hidden = x
        for _ in scales:
            hidden = relu(hidden)
            hidden.retain_grad()
            outputs.append(hidden)
        sum(o.sum() * s for o, s in zip(outputs, scales, strict=True)).backward()
    expected = torch.stack([o.grad for o in reversed(outputs)])  # type: ignore[misc]
    torch.testing.assert_close(monitor.dump(), expected)


def test_no_grad_and_eval_passes_record_no_gradient() -> None:
    layer = nn.Linear(2, 2)
    with OutputGradMonitor(HistoryReducer(), module=layer) as monitor, torch.no_grad():
        layer(torch.ones(1, 2))
    assert monitor.peek() is None


def test_parameter_gradient_matches_grad_and_a_parameter_used_twice_fires_once() -> None:
    layer = nn.Linear(2, 2)
    x = torch.randn(3, 2)
    with ParameterGradMonitor(HistoryReducer(), "weight", module=layer) as monitor:
        (layer(x) + layer(2 * x)).sum().backward()
    assert monitor.reducer.pushes == 1
    torch.testing.assert_close(monitor.peek(), layer.weight.grad)


def test_parameter_gradient_of_a_nested_parameter_and_accumulation() -> None:
    model = nn.Sequential(nn.Linear(2, 1))
    with ParameterGradMonitor(HistoryReducer(), "0.bias", module=model) as monitor:
        for _ in range(2):
            model(torch.ones(4, 2)).sum().backward()
    assert monitor.dump().tolist() == [[4.0], [8.0]]  # .grad as accumulated so far


def test_parameter_gradient_respects_train_and_eval_gating() -> None:
    layer = nn.Linear(2, 1)
    with ParameterGradMonitor(HistoryReducer(), "weight", module=layer, eval_update=False) as monitor:
        layer.eval()
        layer(torch.ones(1, 2)).sum().backward()
    assert monitor.peek() is None and monitor.counts["gated"] == 1


def test_parameter_gradient_needs_a_trainable_parameter() -> None:
    norm = nn.BatchNorm1d(2)
    with pytest.raises(ValueError, match=r"attr must name a leaf tensor that requires grad .* got 'running_mean'"):
        ParameterGradMonitor(HistoryReducer(), "running_mean", module=norm)


def test_partialconstructors_target_submodules_and_parameters() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    grad_of_output = OutputGradMonitor.partialconstructor(HistoryReducer())("1", model)
    grad_of_weight = ParameterGradMonitor.partialconstructor(HistoryReducer())("1.weight", model)
    model(torch.ones(1, 2)).sum().backward()
    assert grad_of_output.module is model[1] and grad_of_output.peek().tolist() == [[1.0]]
    torch.testing.assert_close(grad_of_weight.peek(), model[1].weight.grad)
    with pytest.raises(ValueError, match=r"attr must name a submodule of the Sequential, got '3'"):
        OutputGradMonitor.partialconstructor(HistoryReducer())("3", model)
    grad_of_output.deregister()
    grad_of_weight.deregister()
