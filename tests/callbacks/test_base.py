"""The Callback protocol and the plain-loop driver: event order, eval forwards, exceptions, clean-up."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn as nn

from hookscope.callbacks import Callback, LoopDriver
from hookscope.hooks._registry import REGISTRY


class Recorder(Callback):
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_fit_start(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.events.append(f"fit_start:{type(optimizer).__name__}")

    def on_fit_end(self, error: BaseException | None = None) -> None:
        self.events.append(f"fit_end:{type(error).__name__}")

    def on_batch_start(self, batch: int) -> None:
        self.events.append(f"batch_start:{batch}")

    def on_batch_end(self, batch: int) -> None:
        self.events.append(f"batch_end:{batch}")

    def after_backward(self) -> None:
        self.events.append("after_backward")

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.events.append("before_step")

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.events.append("after_step")


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))


def test_events_follow_a_plain_training_loop_in_order() -> None:
    model, recorder = mlp(), Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with recorder.attach(model, opt):
        for _ in range(2):
            model(torch.randn(5, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
    assert recorder.events == [
        "fit_start:SGD",
        "batch_start:0", "after_backward", "before_step", "after_step", "batch_end:0",
        "batch_start:1", "after_backward", "before_step", "after_step", "batch_end:1",
        "fit_end:NoneType",
    ]  # fmt: skip


def test_eval_forwards_close_the_batch_and_are_not_batches() -> None:
    model, recorder = mlp(), Recorder()
    with recorder.attach(model):
        model(torch.randn(5, 3))
        model.eval()
        model(torch.randn(5, 3))
        model.train()
        model(torch.randn(5, 3))
    assert recorder.events == ["fit_start:NoneType", "batch_start:0", "batch_end:0", "batch_start:1", "batch_end:1",
                               "fit_end:NoneType"]  # fmt: skip


def test_train_only_false_makes_eval_forwards_batches() -> None:
    model, recorder = mlp().eval(), Recorder()
    driver = LoopDriver([recorder], model, train_only=False)
    model(torch.randn(2, 3))
    driver.detach()
    assert recorder.events[1:3] == ["batch_start:0", "batch_end:0"]


def test_exception_in_the_loop_ends_the_fit_with_the_error_and_removes_hooks() -> None:
    model, recorder = mlp(), Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = len(REGISTRY)
    with pytest.raises(RuntimeError, match="boom"), recorder.attach(model, opt):
        model(torch.randn(5, 3))
        raise RuntimeError("boom")
    assert recorder.events[-1] == "fit_end:RuntimeError"
    assert len(REGISTRY) == before
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks


def test_a_failing_fit_start_unwinds_the_callbacks_already_started() -> None:
    class Failing(Callback):
        def on_fit_start(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
            raise ValueError("bad start")

    model, first = mlp(), Recorder()
    with pytest.raises(ValueError, match="bad start"):
        LoopDriver([first, Failing()], model)
    assert first.events == ["fit_start:NoneType", "fit_end:ValueError"]
    assert not model._forward_pre_hooks


def test_detach_is_idempotent_and_the_driver_keeps_no_model_alive() -> None:
    model, recorder = mlp(), Recorder()
    driver = recorder.attach(model)
    model(torch.randn(2, 3))
    driver.detach()
    driver.detach()
    assert recorder.events.count("fit_end:NoneType") == 1
    assert not driver.is_attached
    ref = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert ref() is None
    finally:
        gc.enable()


def test_callbacks_must_be_callbacks() -> None:
    with pytest.raises(
        TypeError, match=r"callbacks must be a list of Callback, got \[1\]; use hookscope Callback objects"
    ):
        LoopDriver([1], mlp())  # type: ignore[list-item]
    with pytest.raises(TypeError, match="model must be an nn.Module, got 'model'"):
        LoopDriver([Recorder()], "model")  # type: ignore[arg-type]


def test_base_callback_is_a_no_op_with_empty_state() -> None:
    callback = Callback()
    with callback.attach(mlp()) as driver:
        assert driver.is_attached
    assert callback.state_dict() == {}
    callback.load_state_dict({})
