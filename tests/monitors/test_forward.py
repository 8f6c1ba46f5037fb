"""InputMonitor, OutputMonitor and StateMonitor on real tiny modules, against what the modules computed."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch
import torch.nn as nn

from hookscope.monitors import InputMonitor, OutputMonitor, StateMonitor
from hookscope.reducers import HistoryReducer, StatsReducer

Pair = namedtuple("Pair", ["left", "right"])


class Nested(nn.Module):
    def forward(self, x: torch.Tensor) -> Any:
        return {"pair": Pair(x + 1, x * 2), "none": None, "name": "text"}


class KeywordOnly(nn.Module):
    def forward(self, *, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x * scale


def test_output_monitor_records_each_output() -> None:
    layer = nn.Linear(3, 2)
    inputs = [torch.randn(4, 3) for _ in range(3)]
    with OutputMonitor(HistoryReducer(), module=layer) as monitor:
        outputs = [layer(x) for x in inputs]
    assert torch.equal(monitor.dump(), torch.stack([o.detach() for o in outputs]))
    assert monitor.counts == {"recorded": 3, "filtered": 0, "gated": 0, "incomplete": 0, "error": 0}


def test_output_monitor_pools_every_tensor_leaf_of_nested_outputs() -> None:
    module, x = Nested(), torch.arange(4.0)
    with OutputMonitor(StatsReducer(), module=module) as monitor:
        module(x)
    expected = torch.cat([x + 1, x * 2])
    stats = monitor.peek()
    assert int(stats.count) == 8 and stats.mean.item() == pytest.approx(expected.mean().item())


def test_outputs_without_tensors_are_filtered_and_counted() -> None:
    class ReturnsNone(nn.Module):
        def forward(self, x: torch.Tensor) -> None:
            return None

    module = ReturnsNone()
    with OutputMonitor(HistoryReducer(), module=module) as monitor:
        module(torch.ones(1))
    assert monitor.peek() is None and monitor.counts["filtered"] == 1


def test_input_monitor_sees_the_first_tensor_also_among_keywords() -> None:
    module, x = KeywordOnly(), torch.randn(2, 2)
    with InputMonitor(HistoryReducer(), module=module) as monitor:
        module(x=x, scale=3.0)
    assert torch.equal(monitor.peek(), x)


def test_input_monitor_map_receives_positional_then_keyword_values() -> None:
    seen: list[tuple[Any, ...]] = []

    def remember(inputs: tuple[Any, ...]) -> torch.Tensor:
        seen.append(inputs)
        return inputs[0]

    module = KeywordOnly()
    x = torch.ones(2)
    with InputMonitor(HistoryReducer(), module=module, map_=remember):
        module(x=x, scale=2.0)
    assert len(seen) == 1 and seen[0][0] is x and seen[0][1] == 2.0


def test_state_monitor_reads_nested_attributes_after_or_before_forward() -> None:
    model = nn.Sequential(nn.BatchNorm1d(2))
    batch = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    after = StateMonitor(HistoryReducer(), "0.running_mean", module=model)
    before = StateMonitor(HistoryReducer(), "0.running_mean", module=model, as_prehook=True)
    with after, before:
        model(batch)
    assert torch.allclose(after.peek(), torch.tensor([0.2, 0.3]))
    assert torch.equal(before.peek(), torch.zeros(2))
    assert len(model._forward_hooks) == 0 and len(model[0]._forward_hooks) == 0


def test_state_monitor_pushes_numbers_as_tensors() -> None:
    layer = nn.Linear(1, 1)
    layer.calls = 0  # type: ignore[assignment]

    def count_calls(module: nn.Module, args: Any) -> None:
        module.calls += 1  # type: ignore[operator]

    handle = layer.register_forward_pre_hook(count_calls)
    with StateMonitor(HistoryReducer(), "calls", module=layer) as monitor:
        layer(torch.ones(1, 1))
        layer(torch.ones(1, 1))
    handle.remove()
    assert monitor.dump().tolist() == [1, 2]


def test_unknown_attribute_lists_the_closest_names() -> None:
    with pytest.raises(ValueError, match=r"attr must name an attribute of the Linear, got 'wieght'.*'weight'"):
        StateMonitor(HistoryReducer(), "wieght", module=nn.Linear(1, 1))


@pytest.mark.parametrize(
    ("train_update", "eval_update", "expected"),
    [(True, True, [0, 1, 2, 3]), (True, False, [0, 2]), (False, True, [1, 3]), (False, False, [])],
)
def test_train_and_eval_gating(train_update: bool, eval_update: bool, expected: list[int]) -> None:
    layer = nn.Identity()
    monitor = OutputMonitor(HistoryReducer(), module=layer, train_update=train_update, eval_update=eval_update)
    for step in range(4):
        layer.train(step % 2 == 0)
        layer(torch.tensor(float(step)))
    dumped = monitor.dump()
    assert ([] if dumped is None else dumped.tolist()) == expected
    assert monitor.counts["gated"] == 4 - len(expected)


def test_eval_and_inference_mode_passes_interleave_with_training() -> None:
    layer = nn.Linear(2, 2)
    train = OutputMonitor(StatsReducer(), module=layer, eval_update=False)
    evaluation = OutputMonitor(StatsReducer(), module=layer, train_update=False)
    for _ in range(3):
        layer.train()
        layer(torch.randn(4, 2)).sum().backward()
        layer.eval()
        with torch.inference_mode():
            layer(torch.randn(5, 2))
        with torch.no_grad():
            layer(torch.randn(5, 2))
    assert int(train.peek().count) == 3 * 8 and int(evaluation.peek().count) == 6 * 10
    train.deregister()
    evaluation.deregister()


@pytest.mark.parametrize("prepend", [False, True])
def test_prepend_runs_before_the_hooks_already_there(prepend: bool) -> None:
    fired: list[str] = []
    layer = nn.Identity()
    layer.register_forward_hook(lambda *_: fired.append("user"))

    def mark(output: torch.Tensor) -> torch.Tensor:
        fired.append("monitor")
        return output

    with OutputMonitor(HistoryReducer(), module=layer, prepend=prepend, map_=mark):
        layer(torch.ones(1))
    assert fired == (["monitor", "user"] if prepend else ["user", "monitor"])


def test_a_module_called_k_times_records_k_observations() -> None:
    relu = nn.ReLU()
    model = nn.Sequential(nn.Linear(2, 2), relu, nn.Linear(2, 2), relu, relu)
    with OutputMonitor(HistoryReducer(), module=relu) as monitor:
        model(torch.randn(3, 2))
    assert monitor.reducer.pushes == 3


def test_recorded_activations_hold_no_graph() -> None:
    layer = nn.Linear(2, 2)
    with OutputMonitor(HistoryReducer(), module=layer) as monitor:
        layer(torch.randn(1, 2)).sum().backward()
    assert monitor.peek().grad_fn is None


def test_failures_while_recording_name_the_monitor() -> None:
    layer = nn.Linear(2, 2)
    with (
        pytest.raises(RuntimeError, match=r"OutputMonitor\(reducer=HistoryReducer.*failed to record.*one tensor"),
        OutputMonitor(HistoryReducer(), module=layer, map_=lambda out: (out, out)),
    ):
        layer(torch.ones(1, 2))
