"""inferno's own tests of its monitors, run against hookscope (issue 26).

Ported from mdominijanni/inferno, `test/observe/test_monitors.py` (https://github.com/mdominijanni/inferno),
Copyright (c) 2023, Marissa Dominijanni, BSD 3-Clause License (the notice and conditions are in
`LICENSE-BSD-3-Clause.txt` beside this file). Changes: the imports (`inferno.Module` is `torch.nn.Module`; the
monitors and `Reducer` are hookscope's). `MockReducer` is written against hookscope's `Reducer` contract (`push`
receives what inferno's `forward` received; hookscope's reducers have no `step_time`/`duration` base arguments and
keep `clear`/`peek`/`dump`/`view` with their own signatures), keeping what the tests read: `latest_inputs`, the
tensors the monitor pushed, unchanged. `MockModule` is inferno's. The assertions and expected values are
inferno's.
"""

from __future__ import annotations

import random
import weakref
from functools import reduce
from typing import Any

import pytest
import torch
from torch.nn import Module

from hookscope.monitors import InputMonitor, Monitor, StateMonitor
from hookscope.reducers import Reducer


class MockReducer(Reducer):
    def __init__(self) -> None:
        Reducer.__init__(self)
        self.latest_inputs: Any = None

    def clear(self, **kwargs: Any) -> None:  # type: ignore[override]
        return None

    def view(self, *args: Any, **kwargs: Any) -> Any:
        return (args, kwargs)

    def dump(self, *args: Any, **kwargs: Any) -> Any:
        return (args, kwargs)

    def peek(self, *args: Any, **kwargs: Any) -> Any:
        return (args, kwargs)

    def push(self, *inputs: torch.Tensor) -> None:  # inferno's forward: the monitor's tensors, as they came
        if len(inputs) == 1:
            self.latest_inputs = inputs[0]
        else:
            self.latest_inputs = inputs

    def _push(self, tensors: tuple[torch.Tensor, ...]) -> None:
        self.push(*tensors)

    def _reset(self) -> None:
        self.latest_inputs = None

    def _move(self, device: torch.device) -> None:
        pass

    def _state(self) -> dict[str, Any]:
        return {}

    def _load(self, state: dict[str, Any]) -> None:
        pass


class MockModule(Module):
    def __init__(self, op=None):  # type: ignore[no-untyped-def]
        Module.__init__(self)
        if op is None:
            self.op = lambda a, b: a + b
        else:
            self.op = op
        self.data = None

    def forward(self, *inputs):  # type: ignore[no-untyped-def]
        if inputs:
            if self.data is not None:
                self.data = reduce(self.op, (self.data, *inputs))
            elif len(inputs) > 1:
                self.data = reduce(self.op, inputs)
            else:
                self.data = inputs[0]

        return self.data


class TestMonitor:
    class MockMonitor(Monitor):
        def __init__(
            self,
            reducer: Reducer,
            module: Module | None = None,
        ):
            Monitor.__init__(
                self,
                reducer=reducer,
                module=module,
                prehook="noop",
                posthook="noop",
            )

        def noop(self, *args):  # type: ignore[no-untyped-def]
            pass

    def test_register_on_init(self):  # type: ignore[no-untyped-def]
        monitor = self.MockMonitor(MockReducer(), Module())
        assert monitor.registered

        monitor = self.MockMonitor(MockReducer(), None)
        assert not monitor.registered

    def test_register_registered(self):  # type: ignore[no-untyped-def]
        sentinel = Module()
        monitor = self.MockMonitor(MockReducer(), sentinel)

        with pytest.raises(RuntimeError) as excinfo:
            monitor.register(Module())

        assert f"{type(monitor).__name__}(Monitor) is already registered to a module so register() was ignored" in str(
            excinfo.value
        )
        assert id(sentinel) == id(monitor._observed())

        monitor.register()
        assert id(sentinel) == id(monitor._observed())

    def test_register_unregistered(self):  # type: ignore[no-untyped-def]
        sentinel = Module()
        monitor = self.MockMonitor(MockReducer(), None)

        monitor.register(sentinel)
        assert monitor.registered


class TestInputMonitor:
    @staticmethod
    def random_shape(mindims=1, maxdims=9, minsize=1, maxsize=9):  # type: ignore[no-untyped-def]
        return tuple(random.randint(mindims, maxdims) for _ in range(random.randint(minsize, maxsize)))

    def test_finalizer_unregistered(self):  # type: ignore[no-untyped-def]
        reducer = MockReducer()
        module = MockModule()
        monitor = InputMonitor(reducer, module)

        monitor.deregister()

        monitorref = weakref.ref(monitor)
        del monitor

        assert monitorref() is None
        assert len(module._forward_pre_hooks) == 0

    def test_finalizer_registered(self):  # type: ignore[no-untyped-def]
        reducer = MockReducer()
        module = MockModule()
        monitor = InputMonitor(reducer, module)

        assert len(module._forward_pre_hooks) == 1

        monitorref = weakref.ref(monitor)
        del monitor

        assert monitorref() is None
        assert len(module._forward_pre_hooks) == 0

    def test_filter(self):  # type: ignore[no-untyped-def]
        shape = self.random_shape()
        reducer = MockReducer()
        module = MockModule()

        monitor = InputMonitor(reducer, None)
        monitor.register(module)

        sentinel = torch.rand(shape)

        module(sentinel)
        assert id(reducer.latest_inputs) == id(sentinel)

        module()
        assert id(reducer.latest_inputs) == id(sentinel)

        sentinel = torch.rand(shape)
        module(sentinel)
        assert id(reducer.latest_inputs) == id(sentinel)

    def test_custom_filter(self):  # type: ignore[no-untyped-def]
        shape = self.random_shape()
        reducer = MockReducer()
        module = MockModule()

        monitor = InputMonitor(reducer, None, filter_=lambda x: bool(len(x) % 2))
        monitor.register(module)

        pass_data = (torch.rand(shape), torch.rand(shape), torch.rand(shape))
        fail_data = (torch.rand(shape), torch.rand(shape))

        module(*pass_data)
        assert all(id(ds) == id(di) for ds, di in zip(reducer.latest_inputs, pass_data, strict=False))

        module(*fail_data)
        assert all(id(ds) == id(di) for ds, di in zip(reducer.latest_inputs, pass_data, strict=False))


class TestStateMonitor:
    @staticmethod
    def random_shape(mindims=1, maxdims=9, minsize=1, maxsize=9):  # type: ignore[no-untyped-def]
        return tuple(random.randint(mindims, maxdims) for _ in range(random.randint(minsize, maxsize)))

    @pytest.mark.parametrize(
        "prehook",
        (True, False),
        ids=("prehook", "posthook"),
    )
    def test_finalizer_unregistered(self, prehook):  # type: ignore[no-untyped-def]
        reducer = MockReducer()
        module = MockModule()
        monitor = StateMonitor(reducer, "data", module, as_prehook=prehook)

        monitor.deregister()

        monitorref = weakref.ref(monitor)
        del monitor

        assert monitorref() is None
        if prehook:
            assert len(module._forward_pre_hooks) == 0
        else:
            assert len(module._forward_hooks) == 0

    @pytest.mark.parametrize(
        "prehook",
        (True, False),
        ids=("prehook", "posthook"),
    )
    def test_finalizer_registered(self, prehook):  # type: ignore[no-untyped-def]
        reducer = MockReducer()
        module = MockModule()
        monitor = StateMonitor(reducer, "data", module, as_prehook=prehook)

        if prehook:
            assert len(module._forward_pre_hooks) == 1
        else:
            assert len(module._forward_hooks) == 1

        monitorref = weakref.ref(monitor)
        del monitor

        assert monitorref() is None
        if prehook:
            assert len(module._forward_pre_hooks) == 0
        else:
            assert len(module._forward_hooks) == 0
