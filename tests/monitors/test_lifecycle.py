"""Registration, removal and robustness: the adversarial cases A1-A7, B3, D4, G3, G4 and G7 for monitors."""

from __future__ import annotations

import copy
import gc
import io
import threading
import weakref
from typing import Any

import pytest
import torch
import torch.nn as nn

from hookscope.hooks import list_hooks
from hookscope.hooks._registry import REGISTRY
from hookscope.monitors import (
    DifferenceMonitor,
    InputMonitor,
    Monitor,
    OutputGradMonitor,
    OutputMonitor,
    ParameterGradMonitor,
    StateMonitor,
)
from hookscope.reducers import HistoryReducer, StatsReducer


def _hook_sizes(module: nn.Module) -> tuple[int, ...]:
    return tuple(len(d) for d in (module._forward_pre_hooks, module._forward_hooks, module._backward_hooks)) + tuple(
        len(p._post_accumulate_grad_hooks or {}) for p in module.parameters()
    )


def _every_monitor(layer: nn.Linear) -> list[Monitor]:
    return [
        InputMonitor(StatsReducer(), module=layer),
        OutputMonitor(StatsReducer(), module=layer),
        StateMonitor(StatsReducer(), "weight", module=layer),
        DifferenceMonitor(StatsReducer(), "weight", module=layer),
        OutputGradMonitor(StatsReducer(), module=layer),
        ParameterGradMonitor(StatsReducer(), "weight", module=layer),
    ]


def test_a_raising_user_hook_propagates_and_every_hook_is_removed() -> None:
    layer = nn.Linear(2, 2)
    before = _hook_sizes(layer)
    user = layer.register_forward_hook(lambda *_: (_ for _ in ()).throw(ValueError("user hook failed")))
    monitors = _every_monitor(layer)
    with (
        pytest.raises(ValueError, match="user hook failed"),
        monitors[0], monitors[1], monitors[2], monitors[3], monitors[4], monitors[5],
    ):  # fmt: skip
        layer(torch.ones(1, 2))
    user.remove()
    assert _hook_sizes(layer) == before and list_hooks(layer) == []


def test_registering_twice_is_a_no_op_and_deregistering_twice_too() -> None:
    layer = nn.Linear(2, 2)
    monitor = OutputMonitor(HistoryReducer(), module=layer)
    monitor.register(layer)
    monitor.register()
    layer(torch.ones(1, 2))
    assert monitor.reducer.pushes == 1 and len(layer._forward_hooks) == 1
    monitor.deregister()
    monitor.deregister()
    assert len(layer._forward_hooks) == 0 and not monitor.is_registered


def test_registering_on_another_module_is_refused_until_deregistered() -> None:
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    monitor = OutputMonitor(HistoryReducer(), module=first)
    with pytest.raises(RuntimeError, match=r"^OutputMonitor\(Monitor\) is already registered to a module so register"):
        monitor.register(second)  # inferno's rule
    assert monitor.module is first and len(first._forward_hooks) == 1 and len(second._forward_hooks) == 0
    monitor.deregister()
    monitor.register(second)
    first(torch.ones(1, 2))
    second(torch.ones(1, 2))
    assert monitor.reducer.pushes == 1 and len(first._forward_hooks) == 0 and monitor.module is second
    monitor.detach()


def test_a_monitor_nobody_keeps_is_freed_and_its_hooks_removed() -> None:
    layer = nn.Linear(2, 2)
    monitor = OutputMonitor(HistoryReducer(), module=layer)
    assert len(layer._forward_hooks) == 1
    alive = weakref.ref(monitor)
    del monitor  # inferno's lifetime: the hook holds the monitor weakly, a finalizer removes the hook
    assert alive() is None and len(layer._forward_hooks) == 0 and list_hooks(layer) == []


def test_nested_monitors_leave_outer_ones_and_user_hooks_alone() -> None:
    fired: list[str] = []
    layer = nn.Identity()
    layer.register_forward_hook(lambda *_: fired.append("user"))
    outer = OutputMonitor(HistoryReducer(), module=layer)
    with outer:
        with OutputMonitor(HistoryReducer()).attach(layer) as inner:
            layer(torch.ones(1))
        layer(torch.ones(1))
        assert outer.is_registered and not inner.is_registered
    layer(torch.ones(1))
    assert fired == ["user"] * 3 and outer.reducer.pushes == 2 and inner.reducer.pushes == 1


def test_a_hook_removing_a_monitor_during_the_call_is_not_an_error() -> None:
    layer = nn.Identity()
    monitor = OutputMonitor(HistoryReducer())
    layer.register_forward_hook(lambda *_: monitor.deregister())
    monitor.register(layer)
    layer(torch.ones(1))  # removed by the hook before it: it still runs in this call (torch's snapshot)
    layer(torch.ones(1))
    assert monitor.reducer.pushes == 1 and not monitor.is_registered


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_register_needs_a_module_and_refuses_scripted_ones() -> None:
    with pytest.raises(RuntimeError, match=r"OutputMonitor.register\(\) needs a module"):
        OutputMonitor(HistoryReducer()).register()
    scripted = torch.jit.script(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="hooks are unsupported on ScriptModule"):
        OutputMonitor(HistoryReducer(), module=scripted)


def test_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match=r"reducer must be a Reducer, got \[\]"):
        OutputMonitor([])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"train_update must be a bool \(True or False\), got 1"):
        OutputMonitor(HistoryReducer(), train_update=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="attr must be a non-empty"):
        StateMonitor(HistoryReducer(), "", module=nn.Linear(1, 1))


def test_a_detached_model_is_freed_with_gc_disabled() -> None:
    gc.collect()
    gc.disable()
    try:
        model = nn.Sequential(nn.Linear(2, 2))
        monitors = _every_monitor(model[0])
        model(torch.ones(1, 2)).sum().backward()
        for monitor in monitors:
            monitor.deregister()
        alive = weakref.ref(model)
        del model
        assert alive() is None
    finally:
        gc.enable()


def test_a_model_dropped_while_monitored_is_freed_too() -> None:
    gc.collect()
    gc.disable()
    try:
        model = nn.Sequential(nn.Linear(2, 2))
        monitor = OutputMonitor(HistoryReducer(), module=model[0])
        model(torch.ones(1, 2))
        alive = weakref.ref(model)
        del model
        assert alive() is None and monitor.module is None and monitor.peek() is not None
    finally:
        gc.enable()


def test_attach_detach_cycles_leave_no_handles() -> None:
    layer = nn.Linear(2, 2)
    start = len(REGISTRY)
    for _ in range(200):
        for monitor in _every_monitor(layer):
            monitor.deregister()
    assert len(REGISTRY) == start and _hook_sizes(layer) == (0, 0, 0, 0, 0)


def test_a_deep_copy_of_the_model_neither_writes_into_nor_duplicates_the_monitor() -> None:
    layer = nn.Linear(2, 2)
    monitor = OutputMonitor(HistoryReducer(), module=layer)
    twin = copy.deepcopy(layer)
    twin(torch.ones(1, 2))
    assert monitor.reducer.pushes == 0
    layer(torch.ones(1, 2))
    assert monitor.reducer.pushes == 1
    monitor.deregister()


def test_saving_the_whole_model_succeeds_without_the_monitor_data() -> None:
    layer = nn.Linear(2, 2)
    monitor = OutputMonitor(HistoryReducer(), module=layer)
    layer(torch.ones(1, 2))
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    restored = torch.load(buffer, weights_only=False)
    restored(torch.ones(1, 2))
    assert monitor.reducer.pushes == 1
    monitor.deregister()


def test_threads_sharing_a_model_are_all_counted() -> None:
    layer = nn.Linear(4, 4)
    monitor = OutputMonitor(StatsReducer(), module=layer)

    def work() -> None:
        for _ in range(50):
            with torch.no_grad():
                layer(torch.ones(2, 4))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert int(monitor.peek().count) == 4 * 50 * 8 and monitor.counts["recorded"] == 200
    monitor.deregister()


def test_repr_names_the_reducer_module_and_state() -> None:
    relu = nn.ReLU()
    monitor = OutputMonitor(StatsReducer(), module=relu)
    text = repr(monitor)
    assert text == "OutputMonitor(reducer=StatsReducer(near_zero=0.001), module=ReLU, path=None, registered)"
    del relu
    assert repr(monitor).endswith("module=None, path=None, not registered)")


def test_filter_and_map_failures_are_reraised_with_context() -> None:
    def broken(_: Any) -> bool:
        raise KeyError("boom")

    layer = nn.ReLU()
    with (
        pytest.raises(RuntimeError, match=r"OutputMonitor\(.*module=ReLU.*failed to record an observation: 'boom'"),
        OutputMonitor(HistoryReducer(), module=layer, filter_=broken),
    ):
        layer(torch.ones(1))


def test_monitor_hooks_never_sync_during_training_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
    monitors = [*_every_monitor(model[0]), OutputMonitor(StatsReducer(), module=model[1], map_=lambda out: out)]
    batches = [torch.randn(4, 3) for _ in range(20)]

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("host-device sync in a monitor hook")

    with monkeypatch.context() as patched:
        for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"):
            patched.setattr(torch.Tensor, name, refuse)
        for batch in batches:
            model(batch).sum().backward()
    assert [m.counts["recorded"] for m in monitors] == [20] * 7
    for monitor in monitors:
        monitor.deregister()


def test_a_monitor_dropped_by_its_user_is_freed_with_gc_disabled() -> None:
    layer = nn.Linear(2, 2)
    monitors = _every_monitor(layer)
    layer(torch.ones(1, 2)).sum().backward()
    gc.collect()  # torch's multi-grad hooks leave a cycle behind each backward; not the monitors' own
    gc.disable()
    try:
        for monitor in monitors:
            monitor.deregister()
        alive = [weakref.ref(monitor) for monitor in monitors]
        del monitors, monitor
        assert [ref() for ref in alive] == [None] * 6
    finally:
        gc.enable()


def test_the_base_monitor_places_inferno_prehook_and_posthook() -> None:
    calls: list[str] = []

    class Tracing(Monitor):
        def before(self, module: nn.Module, args: Any) -> None:
            calls.append("pre")

    layer = nn.Linear(2, 2)
    monitor = Tracing(HistoryReducer(), layer, prehook="before", posthook=lambda m, a, o: calls.append("post"))
    layer(torch.ones(1, 2))
    layer.eval()
    monitor.eval_update = False
    layer(torch.ones(1, 2))  # gated: neither hook runs in eval mode
    assert calls == ["pre", "post"] and monitor.counts["gated"] == 2
    monitor.deregister()
    assert not layer._forward_hooks and not layer._forward_pre_hooks


def test_prehook_and_posthook_are_refused_where_they_would_be_ignored() -> None:
    with pytest.raises(TypeError, match=r"^prehook must be None for OutputMonitor, which places its own hooks"):
        OutputMonitor(HistoryReducer(), prehook=lambda m, a: None)
    with pytest.raises(ValueError, match=r"^posthook must name a method of Monitor, got 'regster'; did you mean"):
        Monitor(HistoryReducer(), posthook="regster")
    with pytest.raises(TypeError, match=r"^Monitor places no hook: Monitor is the base of InputMonitor"):
        Monitor(HistoryReducer(), nn.Linear(1, 1))
