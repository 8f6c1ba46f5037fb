"""`torch.save(model)`, `pickle` and `copy.deepcopy` of a model with any hookscope hook attached: they work, the copy
computes what the model does, writes nothing into the original's records, and carries no hook of hookscope's (not
even an inert one); the user's own hooks are copied as torch copies them."""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn

import hookscope
from hookscope.callbacks import ActivationStats, Callback, HookCallback
from hookscope.hooks._calls import CalledHook
from hookscope.hooks._registry import REGISTRY
from hookscope.monitors import OutputGradMonitor, OutputMonitor, ParameterGradMonitor, StateMonitor
from hookscope.reducers import HistoryReducer, StatsReducer
from hookscope.weights import (
    DeadUnitDetector,
    MaxNorm,
    UpdateRatioMonitor,
    add_weight_distribution_monitor,
    add_weight_norm_constraint_hook,
    add_weight_update_monitor_hook,
    register_constraint,
    register_weight_decay,
)

Fingerprint = Callable[[], Any]
Attach = Callable[[nn.Module, torch.optim.Optimizer], tuple[Fingerprint, Callable[[], None]]]


class Count(Callback):
    def __init__(self) -> None:
        self.events = 0

    def on_batch_start(self, batch: int) -> None:
        self.events += 1

    def after_backward(self) -> None:
        self.events += 1


def attach_watch(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[Fingerprint, Callable[[], None]]:
    w = hookscope.watch(model, opt)
    w.attach()
    return lambda: (w.results().activations["0"]["count"].tolist(), w.results().dropped), w.detach


def attach_stats(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[Fingerprint, Callable[[], None]]:
    stats = ActivationStats(with_hist=True)
    driver = stats.attach(model, opt)
    return lambda: [row[0]["mean"] for row in stats.stats], driver.detach


def attach_hooks(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[Fingerprint, Callable[[], None]]:
    forward, backward = hookscope.Hook(model[0], lambda m, i, o: o.sum()), hookscope.hook_outputs(model, grad=True)
    return lambda: (forward.stored, backward.stored), lambda: (forward.remove(), backward.remove())


def attach_monitors(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[Fingerprint, Callable[[], None]]:
    monitors = [
        OutputMonitor(StatsReducer(), module=model[0]),
        OutputGradMonitor(HistoryReducer(), module=model[2]),
        ParameterGradMonitor(HistoryReducer(), "weight", module=model[0]),
        StateMonitor(HistoryReducer(), "weight", module=model[2]),
    ]
    return lambda: [m.counts for m in monitors], lambda: [m.detach() for m in monitors]


def attach_callback(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[Fingerprint, Callable[[], None]]:
    counter, shapes = Count(), HookCallback(hook=lambda m, i, o: tuple(o.shape))
    first, second = counter.attach(model, opt), shapes.attach(model)
    return lambda: (counter.events, list(shapes.stored)), lambda: (first.detach(), second.detach())


def attach_weights(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[Fingerprint, Callable[[], None]]:
    distribution = add_weight_distribution_monitor(model)
    dead = DeadUnitDetector().attach(model)
    ratios = UpdateRatioMonitor().attach(model, opt)
    updates = add_weight_update_monitor_hook(opt, log_interval=1)
    forward = register_constraint(model, MaxNorm(5.0), "0", mode="forward")
    stepped = register_constraint(model, MaxNorm(5.0), "2", optimizer=opt)
    max_norm = add_weight_norm_constraint_hook(model, 5.0, "2")
    decay = register_weight_decay(model, 0.01, lr=opt)

    def fingerprint() -> Any:
        return (
            dict(distribution["history"]), dead.forwards(), ratios.steps, updates["step"], forward.applications,
            stepped.applications,
        )  # fmt: skip

    def remove() -> None:
        distribution["remove"]()
        dead.detach()
        ratios.detach()
        updates["remove"]()
        forward.remove()
        stepped.remove()
        for handle in max_norm:
            handle.remove()
        decay.remove()

    return fingerprint, remove


ATTACH: dict[str, Attach] = {
    "watch": attach_watch,
    "ActivationStats": attach_stats,
    "Hook/Hooks": attach_hooks,
    "monitors": attach_monitors,
    "LoopDriver/HookCallback": attach_callback,
    "weights/constraints": attach_weights,
}


def through_pickle(model: nn.Module) -> nn.Module:
    copied: nn.Module = pickle.loads(pickle.dumps(model))  # our own bytes, written just above
    return copied


def through_torch_save(model: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    copied: nn.Module = torch.load(buffer, weights_only=False)  # our own bytes, written just above
    return copied


COPIES = {"pickle": through_pickle, "torch.save": through_torch_save, "deepcopy": copy.deepcopy}


def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    out.pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    return out.detach()


@pytest.mark.parametrize("how", list(COPIES))
@pytest.mark.parametrize("entry", list(ATTACH))
def test_a_copy_of_a_hooked_model_works_and_is_inert(entry: str, how: str) -> None:
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model[0].register_forward_hook(user_hook)
    fingerprint, remove = ATTACH[entry](model, opt)
    assert REGISTRY.handles()
    try:
        step(model, opt, torch.randn(4, 3))
        x = torch.randn(4, 3)
        with torch.no_grad():
            expected = model(x)  # before the copy: a constraint may project the weights in this forward
        before = fingerprint()
        twin = COPIES[how](model)
        twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
        assert torch.equal(step(twin, twin_opt, x), expected)  # the copy computes what the model computes
        assert fingerprint() == before  # and wrote nothing into the original's records
        assert hook_tables(twin) == {"forward": [user_hook]}  # the user's hook only, ours left behind
        assert not any("__reduce_ex__" in m.__dict__ for m in twin.modules())
    finally:
        remove()
    assert not any("__reduce_ex__" in m.__dict__ for m in model.modules())  # nothing left once detached


def user_hook(module: nn.Module, args: Any, output: Any) -> None:
    """A user's own forward hook (module level, so it pickles)."""


def hook_tables(model: nn.Module) -> dict[str, list[Any]]:
    """Every hook in the model's modules' hook dicts and torch's side tables, by table, non-empty tables only."""
    found: dict[str, list[Any]] = {}
    for module in model.modules():
        for name, table in vars(module).items():
            if name.endswith(("_hooks", "_hooks_with_kwargs", "_hooks_always_called")) and isinstance(table, dict):
                for hook in table.values():
                    found.setdefault(name.removeprefix("_").removesuffix("_hooks"), []).append(hook)
    assert not any(isinstance(h, CalledHook) for hooks in found.values() for h in hooks)
    return found
