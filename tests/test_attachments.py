"""Every public entry point that attaches something returns a handle: `remove()` (idempotent) and `with`.

One table, `ATTACHMENTS`, lists them all (hooks, monitors, weights, callbacks, watch). For each, on a real tiny
model trained for a step: the handle has `remove()`, `__enter__` and `__exit__`; something is attached; after
`remove()` (twice) the model, its parameters, the optimizer and torch's global hook dicts are as before
(forward/backward hooks, parametrizations, post-accumulate-grad hooks, optimizer step hooks) and hookscope's
registry lists none of the new hooks; and a `with` block removes everything also when it raises.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.modules.module as module_globals
import torch.optim.optimizer as optimizer_globals
from torch.nn.utils import parametrize

import hookscope
from hookscope.callbacks import Callback, HookCallback, LoopDriver
from hookscope.hooks import (
    Hook,
    Hooks,
    hook_output,
    hook_outputs,
    register_global_module_hook,
    register_global_optimizer_hook,
    register_module_hook,
    register_optimizer_hook,
    register_output_grad_hook,
    register_post_accumulate_grad_hook,
    register_tensor_hook,
)
from hookscope.monitors import (
    DifferenceMonitor,
    InputMonitor,
    MonitorPool,
    OutputGradMonitor,
    OutputMonitor,
    ParameterGradMonitor,
    StateMonitor,
)
from hookscope.reducers import StatsReducer
from hookscope.weights import (
    DeadUnitDetector,
    MaxNorm,
    UpdateRatioMonitor,
    add_weight_change_monitor_hook,
    add_weight_distribution_monitor,
    add_weight_norm_constraint_hook,
    add_weight_update_monitor_hook,
    register_constraint,
    register_weight_decay,
)

# A global full backward hook also fires on the first layer, whose input needs no gradient: torch warns, rightly.
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")

Model = nn.Sequential
Optimizer = torch.optim.Optimizer


def _model() -> Model:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _train(model: Model, optimizer: Optimizer) -> None:
    model.train()
    loss = model(torch.randn(6, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


class _Counter(Callback):
    """A callback that listens to every event a LoopDriver emits (so the driver places all its hooks)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def on_batch_start(self, batch: int) -> None:
        self.events.append("batch")

    def after_backward(self) -> None:
        self.events.append("backward")

    def after_optimizer_step(self, optimizer: Optimizer) -> None:
        self.events.append("step")


def _attached_watch(model: Model, optimizer: Optimizer) -> Any:
    """A watch attached in a plain loop: the `Watch` itself is the handle (`remove()`, `with`)."""
    watched = hookscope.watch(model, optimizer)
    watched.attach()
    return watched


def _observe(*args: Any) -> None:
    return None


@dataclass(frozen=True)
class Attachment:
    """An entry point: `attach(model, optimizer)` attaches and returns its handle; `is_live(handle)` tells
    whether what it attached without hooks (a snapshot) is still there (`None`: it attaches hooks)."""

    attach: Callable[[Model, Optimizer], Any]
    is_live: Callable[[Any], bool] | None = None


ATTACHMENTS: dict[str, Attachment] = {
    # hookscope.hooks
    **{
        f"register_module_hook[{kind}]": Attachment(
            lambda m, o, kind=kind: register_module_hook(m[2], kind, _observe)  # type: ignore[misc]
        )
        for kind in ("forward_pre", "forward", "backward_pre", "backward")
    },
    **{
        f"register_global_module_hook[{kind}]": Attachment(
            lambda m, o, kind=kind: register_global_module_hook(kind, _observe)  # type: ignore[misc]
        )
        for kind in ("forward_pre", "forward", "backward")
    },
    **{
        f"register_optimizer_hook[{kind}]": Attachment(
            lambda m, o, kind=kind: register_optimizer_hook(o, kind, _observe)  # type: ignore[misc]
        )
        for kind in ("step_pre", "step_post")
    },
    **{
        f"register_global_optimizer_hook[{kind}]": Attachment(
            lambda m, o, kind=kind: register_global_optimizer_hook(kind, _observe)  # type: ignore[misc]
        )
        for kind in ("step_pre", "step_post")
    },
    "register_output_grad_hook": Attachment(lambda m, o: register_output_grad_hook(m[2], _observe)),
    "register_tensor_hook": Attachment(lambda m, o: register_tensor_hook(m[0].weight, _observe)),
    "register_post_accumulate_grad_hook": Attachment(
        lambda m, o: register_post_accumulate_grad_hook(m[0].weight, _observe)
    ),
    "Hook": Attachment(lambda m, o: Hook(m[2], _observe)),
    "Hook[backward]": Attachment(lambda m, o: Hook(m[2], _observe, is_forward=False)),
    "Hooks": Attachment(lambda m, o: Hooks([m[2]], _observe)),
    "hook_output": Attachment(lambda m, o: hook_output(m[2])),
    "hook_output[grad]": Attachment(lambda m, o: hook_output(m[2], grad=True)),
    "hook_outputs": Attachment(lambda m, o: hook_outputs([m[1], m[2]])),
    # hookscope.monitors
    "InputMonitor.attach": Attachment(lambda m, o: InputMonitor(StatsReducer()).attach(m[0])),
    "OutputMonitor.attach": Attachment(lambda m, o: OutputMonitor(StatsReducer()).attach(m[0])),
    "StateMonitor.attach": Attachment(lambda m, o: StateMonitor(StatsReducer(), "weight").attach(m[0])),
    "DifferenceMonitor.attach": Attachment(lambda m, o: DifferenceMonitor(StatsReducer(), "weight").attach(m[0])),
    "OutputGradMonitor.attach": Attachment(lambda m, o: OutputGradMonitor(StatsReducer()).attach(m[0])),
    "ParameterGradMonitor.attach": Attachment(lambda m, o: ParameterGradMonitor(StatsReducer(), "weight").attach(m[0])),
    "MonitorPool.attach": Attachment(
        lambda m, o: MonitorPool(OutputMonitor.partialconstructor(StatsReducer())).attach(m)
    ),
    # hookscope.weights (the dicts of the fixed weight_hooks API are handles too)
    "add_weight_change_monitor_hook": Attachment(
        lambda m, o: add_weight_change_monitor_hook(m), is_live=lambda data: data["initial_weights"] is not None
    ),
    "add_weight_distribution_monitor": Attachment(lambda m, o: add_weight_distribution_monitor(m)),
    "add_weight_update_monitor_hook": Attachment(lambda m, o: add_weight_update_monitor_hook(o)),
    "add_weight_norm_constraint_hook": Attachment(lambda m, o: add_weight_norm_constraint_hook(m, 1.0)),
    **{
        f"register_constraint[{mode}]": Attachment(
            lambda m, o, mode=mode: register_constraint(m, MaxNorm(1.0), mode=mode, optimizer=o)  # type: ignore[misc]
        )
        for mode in ("step", "forward", "parametrize")
    },
    "register_weight_decay": Attachment(lambda m, o: register_weight_decay(m, 0.1, lr=o)),
    "DeadUnitDetector.attach": Attachment(lambda m, o: DeadUnitDetector().attach(m)),
    "UpdateRatioMonitor.attach": Attachment(lambda m, o: UpdateRatioMonitor().attach(m, o)),
    # hookscope.callbacks and watch
    "Callback.attach": Attachment(lambda m, o: _Counter().attach(m, o)),
    "LoopDriver": Attachment(lambda m, o: LoopDriver([_Counter()], m, o)),
    "HookCallback.attach": Attachment(lambda m, o: HookCallback(hook=_observe).attach(m, o)),
    "ActivationStats.attach": Attachment(lambda m, o: hookscope.ActivationStats().attach(m, o)),
    "Watch.attach": Attachment(lambda m, o: hookscope.watch(m, o).attach()),
    "watch": Attachment(lambda m, o: _attached_watch(m, o)),
}

_MODULE_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_DICTS = (
    (module_globals, "_global_forward_hooks"),
    (module_globals, "_global_forward_pre_hooks"),
    (module_globals, "_global_backward_hooks"),
    (module_globals, "_global_backward_pre_hooks"),
    (optimizer_globals, "_global_optimizer_pre_hooks"),
    (optimizer_globals, "_global_optimizer_post_hooks"),
)


def hooks_in_place(model: Model, optimizer: Optimizer) -> dict[str, Any]:
    """Every hook torch holds for the model, its parameters, the optimizer and the process, by where it is."""
    found: dict[str, Any] = {}
    for path, module in model.named_modules():
        for attribute in _MODULE_DICTS:
            found[f"{path}.{attribute}"] = list(getattr(module, attribute))
        found[f"{path}.parametrized"] = parametrize.is_parametrized(module)
    for name, parameter in model.named_parameters():
        found[f"{name}._backward_hooks"] = list(parameter._backward_hooks or {})
        found[f"{name}._post_accumulate_grad_hooks"] = list(parameter._post_accumulate_grad_hooks or {})
    found["optimizer.step_pre"] = list(optimizer._optimizer_step_pre_hooks)
    found["optimizer.step_post"] = list(optimizer._optimizer_step_post_hooks)
    for holder, attribute in _GLOBAL_DICTS:
        found[attribute] = list(getattr(holder, attribute))
    return found


def registered_ids() -> set[int | None]:
    return {info.id for info in hookscope.list_hooks()}


class Boom(Exception):
    """Raised inside a `with` block."""


@pytest.mark.parametrize("name", list(ATTACHMENTS))
def test_the_handle_removes_everything_it_attached(name: str) -> None:
    entry = ATTACHMENTS[name]
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before, ids = hooks_in_place(model, optimizer), registered_ids()

    handle = entry.attach(model, optimizer)
    for method in ("remove", "__enter__", "__exit__"):
        assert callable(getattr(handle, method, None)), f"{name} returns {type(handle).__name__} without {method}"
    _train(model, optimizer)
    attached = hooks_in_place(model, optimizer) != before or bool(registered_ids() - ids)
    assert entry.is_live(handle) if entry.is_live else attached, f"{name} attached nothing"
    handle.remove()
    handle.remove()  # idempotent
    assert hooks_in_place(model, optimizer) == before
    assert registered_ids() - ids == set()
    assert entry.is_live is None or not entry.is_live(handle)
    _train(model, optimizer)  # training goes on without them


@pytest.mark.parametrize("name", list(ATTACHMENTS))
def test_leaving_a_with_block_removes_everything_also_when_it_raises(name: str) -> None:
    entry = ATTACHMENTS[name]
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before, ids = hooks_in_place(model, optimizer), registered_ids()
    handle = entry.attach(model, optimizer)
    with pytest.raises(Boom), handle as entered:
        assert entered is handle
        _train(model, optimizer)
        raise Boom
    assert hooks_in_place(model, optimizer) == before
    assert registered_ids() - ids == set()
    assert entry.is_live is None or not entry.is_live(handle)


def test_the_table_covers_every_attaching_entry_point() -> None:
    """Every exported `register_*`/`add_weight_*`/`hook_output*` function and class with `attach` is listed."""
    listed = {name.split("[")[0].removesuffix(".attach") for name in ATTACHMENTS}
    exported = set()
    for package in ("", ".hooks", ".monitors", ".weights", ".callbacks", ".watch"):  # "": the top level
        namespace = importlib.import_module(f"hookscope{package}")
        for name in namespace.__all__:
            value = getattr(namespace, name)
            attaches = name.startswith(("register_", "add_weight_", "hook_output")) or hasattr(value, "attach")
            if callable(value) and attaches and name not in ("register_check", "Monitor", "Callback"):
                exported.add(name)
    assert exported - listed == set()
    assert {"Callback", "Watch", "Hook", "Hooks"} <= listed
