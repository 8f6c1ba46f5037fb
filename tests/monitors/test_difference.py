"""Every documented rule of DifferenceMonitor, on modules whose attributes change in forward."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn

from hookscope.monitors import DifferenceMonitor
from hookscope.reducers import HistoryReducer, StatsReducer


class Trace(nn.Module):
    """Keeps `state` (a tensor or None) and sets it to `next_state` in forward; may raise on request."""

    def __init__(self, state: torch.Tensor | None) -> None:
        super().__init__()
        self.state = state
        self.next_state: torch.Tensor | None = None
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("forward failed halfway")
        self.state = self.next_state
        return x


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Trace(torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def _step(module: Trace, next_state: torch.Tensor | None) -> None:
    module.next_state = next_state
    module(torch.ones(1))


def test_records_after_minus_before_by_default() -> None:
    module = Trace(torch.tensor([1.0, 2.0]))
    with DifferenceMonitor(HistoryReducer(), "state", module=module) as monitor:
        _step(module, torch.tensor([4.0, 3.0]))
        _step(module, torch.tensor([0.0, 0.0]))
    assert monitor.dump().tolist() == [[3.0, 1.0], [-4.0, -3.0]]


def test_in_place_changes_are_seen_through_a_copy_of_the_before_value() -> None:
    norm = nn.BatchNorm1d(2)
    batch = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    before = norm.running_mean.clone()
    with DifferenceMonitor(HistoryReducer(), "running_mean", module=norm) as monitor:
        norm(batch)
    torch.testing.assert_close(monitor.peek(), norm.running_mean - before)


def test_nested_attribute_keeps_the_hook_on_the_registered_module() -> None:
    holder = Holder()
    with DifferenceMonitor(HistoryReducer(), "inner.state", module=holder) as monitor:
        assert (len(holder._forward_pre_hooks), len(holder.inner._forward_pre_hooks)) == (1, 0)
        holder.inner.next_state = torch.tensor([2.0, 5.0])
        holder(torch.ones(1))
    assert monitor.peek().tolist() == [2.0, 5.0]


def test_post_is_the_left_hand_argument_of_filter_map_and_op() -> None:
    module = Trace(torch.tensor([1.0]))
    calls: dict[str, tuple[Any, Any]] = {}

    def filter_(post: Any, pre: Any) -> bool:
        calls["filter_"] = (post, pre)
        return True

    def op_(post: Any, pre: Any) -> Any:
        calls["op_"] = (post, pre)
        return post * 10 + pre

    with DifferenceMonitor(HistoryReducer(), "state", module=module, filter_=filter_, op_=op_) as monitor:
        _step(module, torch.tensor([5.0]))
    for name in ("filter_", "op_"):
        post, pre = calls[name]
        assert (post.item(), pre.item()) == (5.0, 1.0), name
    assert monitor.peek().tolist() == [51.0]


def test_default_filter_rejects_only_when_both_sides_are_none() -> None:
    module = Trace(None)
    with DifferenceMonitor(HistoryReducer(), "state", module=module) as monitor:
        _step(module, None)  # None -> None: rejected
        _step(module, torch.tensor([2.0, 3.0]))  # None -> tensor: zeros before
        _step(module, None)  # tensor -> None: zeros after
    assert monitor.dump().tolist() == [[2.0, 3.0], [-2.0, -3.0]]
    assert monitor.counts["filtered"] == 1 and monitor.counts["recorded"] == 2


def test_default_map_fills_a_none_side_with_zeros_shaped_like_the_other_then_applies_op() -> None:
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def op_(post: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        seen.append((post, pre))
        return post + pre

    module = Trace(None)
    with DifferenceMonitor(HistoryReducer(), "state", module=module, op_=op_) as monitor:
        _step(module, torch.ones(2, 3))
    post, pre = seen[0]
    assert torch.equal(pre, torch.zeros(2, 3)) and torch.equal(post, torch.ones(2, 3))
    assert torch.equal(monitor.peek(), torch.ones(2, 3))


def test_user_map_receives_the_raw_values() -> None:
    received: list[tuple[Any, Any]] = []

    def map_(post: Any, pre: Any) -> torch.Tensor:
        received.append((post, pre))
        return torch.tensor(float(pre is None))

    module = Trace(None)
    with DifferenceMonitor(HistoryReducer(), "state", module=module, map_=map_, op_=lambda a, b: 1 / 0):
        _step(module, torch.ones(1))
    assert received[0][1] is None and torch.equal(received[0][0], torch.ones(1))


def test_partialconstructor_passes_every_argument_and_copies_the_reducer() -> None:
    reducer = HistoryReducer()
    construct = DifferenceMonitor.partialconstructor(
        reducer, train_update=False, eval_update=True, prepend=True, filter_=None, map_=None, op_=torch.add
    )
    first, second = Trace(torch.tensor([1.0])), Trace(torch.tensor([1.0]))
    monitors = [construct("state", first), construct("state", second)]
    assert all(m.reducer is not reducer for m in monitors) and monitors[0].reducer is not monitors[1].reducer
    assert (monitors[0].train_update, monitors[0].eval_update, monitors[0].prepend) == (False, True, True)
    first.eval()
    _step(first, torch.tensor([2.0]))
    assert monitors[0].peek().tolist() == [3.0]  # op_ = add reached the monitor
    assert monitors[1].peek() is None and reducer.peek() is None
    for monitor in monitors:
        monitor.deregister()


def test_a_failed_forward_is_counted_incomplete_and_later_calls_pair_correctly() -> None:
    module = Trace(torch.tensor([1.0]))
    with DifferenceMonitor(HistoryReducer(), "state", module=module) as monitor:
        module.fail = True
        with pytest.raises(RuntimeError, match="forward failed halfway"):
            module(torch.ones(1))
        module.fail = False
        _step(module, torch.tensor([4.0]))
    assert monitor.counts["incomplete"] == 1 and monitor.dump().tolist() == [[3.0]]


def test_reentrant_calls_pair_each_call_with_its_own_before() -> None:
    class Recursive(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.depth = torch.tensor(0.0)

        def forward(self, levels: int) -> None:
            self.depth = self.depth + 1
            if levels > 1:
                self(levels - 1)
            self.depth = self.depth + 10

    module = Recursive()
    with DifferenceMonitor(HistoryReducer(), "depth", module=module) as monitor:
        module(3)
    # innermost call: +1 +10; middle: +1 (+11 inner) +10; outer: +1 (+22 inner) +10
    assert monitor.dump().tolist() == [11.0, 22.0, 33.0]


def test_gated_calls_record_nothing() -> None:
    module = Trace(torch.tensor([0.0]))
    with DifferenceMonitor(StatsReducer(), "state", module=module, eval_update=False) as monitor:
        module.eval()
        _step(module, torch.tensor([5.0]))
        module.train()
        _step(module, torch.tensor([7.0]))
    assert int(monitor.peek().count) == 1 and monitor.peek().mean.item() == 2.0
    assert monitor.counts["gated"] == 1


def test_clear_forgets_state_and_reinitializes_the_reducer() -> None:
    module = Trace(torch.tensor([0.0]))
    monitor = DifferenceMonitor(HistoryReducer(), "state", module=module)
    _step(module, torch.tensor([1.0]))
    monitor.clear()
    assert monitor.peek() is None and monitor.counts["recorded"] == 0
    _step(module, torch.tensor([3.0]))
    assert monitor.dump().tolist() == [[2.0]]
    monitor.deregister()
