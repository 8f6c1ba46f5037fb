"""HookCallback: fastai's semantics (every, remove_end, is_forward, detach/cpu) in a plain loop."""

from __future__ import annotations

import gc
import math
import weakref
from typing import Any

import pytest
import torch
import torch.nn as nn

from hookscope.callbacks import HookCallback


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


class Counting(HookCallback):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[int] = []
        self.current = -1

    def on_batch_start(self, batch: int) -> None:
        self.current = batch
        super().on_batch_start(batch)

    def hook(self, m: nn.Module, i: Any, o: Any) -> Any:
        self.calls.append(self.current)
        return o


@pytest.mark.parametrize("n", [11, 12, 13])
@pytest.mark.parametrize("every", [1, 4])
def test_every_observes_batches_whose_index_is_a_multiple(n: int, every: int) -> None:
    model, callback = mlp(), Counting(every=every)
    with callback.attach(model):
        for _ in range(n):
            model(torch.randn(2, 3))
    observed = sorted(set(callback.calls))
    assert observed == list(range(0, n, every))
    assert len(observed) == math.ceil(n / every)
    assert callback.calls.count(0) == 2  # both Linear layers (the modules with parameters)


def test_stored_holds_detached_cpu_copies_in_model_order() -> None:
    model = mlp()
    callback = HookCallback(hook=lambda m, i, o: o)
    with callback.attach(model):
        x = torch.randn(2, 3)
        out = model(x)
    assert callback.paths == ["0", "2"]
    assert [t.shape for t in callback.stored] == [(2, 4), (2, 2)]
    assert all(not t.requires_grad and t.device.type == "cpu" for t in callback.stored)
    torch.testing.assert_close(callback.stored[1], out.detach())
    assert not model[0]._forward_hooks


def test_without_detach_the_hook_sees_the_graph() -> None:
    model = mlp()
    callback = HookCallback(hook=lambda m, i, o: o.requires_grad, detach=False, cpu=False)
    with callback.attach(model) as driver:
        model[0](torch.randn(1, 3))
        assert driver.is_attached
    assert callback.stored == [True, None]


def test_backward_hooks_receive_gradients() -> None:
    model = mlp()
    callback = HookCallback(modules="2", is_forward=False, hook=lambda m, gi, go: go[0])
    with callback.attach(model):
        x = torch.randn(2, 3)
        model(x).pow(2).sum().backward()
    expected = 2 * model(x).detach()
    torch.testing.assert_close(callback.stored[0], expected)


def test_remove_end_false_keeps_hooks_after_a_normal_end_only() -> None:
    model = mlp()
    keep = HookCallback(remove_end=False)
    with keep.attach(model):
        model(torch.randn(1, 3))
    assert keep.is_registered and len(model[0]._forward_hooks) == 1
    keep.remove()
    assert not model[0]._forward_hooks
    with pytest.raises(KeyError), keep.attach(model):
        raise KeyError("stop")
    assert not keep.is_registered and not model[0]._forward_hooks


def test_hooks_are_gone_after_an_exception_inside_the_loop() -> None:
    model = mlp()
    callback = HookCallback(every=2)
    with pytest.raises(RuntimeError, match="inside"), callback.attach(model):
        model(torch.randn(1, 3))
        raise RuntimeError("inside")
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_modules_may_be_a_list_of_modules_or_a_selector() -> None:
    model = mlp()
    by_list = HookCallback(modules=[model[2], model[0]])
    by_type = HookCallback(modules=nn.ReLU)
    with by_list.attach(model), by_type.attach(model):
        model(torch.randn(1, 3))
    assert by_list.paths == ["0", "2"] and by_type.paths == ["1"]
    with pytest.raises(ValueError, match="modules must all be modules of the model, got 1 that are not"):
        HookCallback(modules=[nn.Linear(1, 1)]).attach(model)


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="every must be a positive int or None, got 0"):
        HookCallback(every=0)
    with pytest.raises(TypeError, match=r"hook must be a callable or None, got 3; pass the function itself"):
        HookCallback(hook=3)  # type: ignore[arg-type]


def test_a_deleted_model_is_freed_after_the_fit() -> None:
    model = mlp()
    callback = HookCallback(hook=lambda m, i, o: None)
    with callback.attach(model):
        model(torch.randn(1, 3))
    ref = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert ref() is None
        assert callback.hooked_modules == []
    finally:
        gc.enable()
