"""A failure inside hookscope's own hooks never reaches the training: counted, warned about once (pointing at the
user's line), raised only with strict=True; a failure inside a hook the user passed in is raised, naming it."""

from __future__ import annotations

import copy
import pickle
import sys
import warnings
from typing import Any

import pytest
import torch
import torch.nn as nn

from hookscope.callbacks import ActivationStats
from hookscope.hooks import HookFailureWarning, register_module_hook, scope
from hookscope.hooks._calls import HookErrors
from hookscope.monitors import OutputMonitor
from hookscope.reducers import HistoryReducer
from hookscope.stats._tables import RecordTable
from hookscope.watch import watch
from hookscope.watch._params import ParamRecorder
from hookscope.weights import add_weight_distribution_monitor

THIS_FILE = __file__


def broken(*args: object, **kwargs: object) -> None:
    raise ArithmeticError("planted failure inside hookscope")


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))


def train(model: nn.Module, steps: int = 3) -> list[torch.Tensor]:
    """The training the failures must not change: its losses and final weights."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for k in range(steps):
        loss = model(torch.randn(4, 3, generator=torch.Generator().manual_seed(k))).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return [*losses, *(p.detach() for p in model.parameters())]


def only_failure_warnings(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, HookFailureWarning)]


def test_a_failing_watch_hook_is_counted_warned_once_and_training_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = train(mlp())
    monkeypatch.setattr(RecordTable, "stage", broken)  # every output the watch reads: every forward hook fails
    model = mlp()
    with warnings.catch_warnings(record=True) as caught, watch(model, strict=False) as w:
        warnings.simplefilter("always")
        got = train(model)
    for mine, theirs in zip(got, expected, strict=True):
        assert torch.equal(mine, theirs)  # the same training
    failures = only_failure_warnings(caught)
    assert len(failures) == 1 and "planted failure inside hookscope" in str(failures[0].message)
    assert failures[0].filename == THIS_FILE  # it points at the user's line that ran the forward
    assert w.results().dropped["error"] == 3 * 3  # three modules, three steps
    assert w.errors.failures == 9 and "ArithmeticError" in (w.errors.last or "")


def test_strict_raises_the_failure_of_a_watch_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RecordTable, "stage", broken)
    model = mlp()
    with pytest.raises(ArithmeticError, match="planted failure inside hookscope"), watch(model, strict=True):
        train(model, steps=1)
    assert not any(m._forward_hooks for m in model.modules())  # and every hook is gone


def test_strict_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKSCOPE_STRICT", "0")
    assert not HookErrors("x").strict and HookErrors("x", strict=True).strict
    monkeypatch.setenv("HOOKSCOPE_STRICT", "1")
    assert HookErrors("x").strict and not HookErrors("x", strict=False).strict
    with pytest.raises(TypeError, match=r"strict must be a bool \(True or False\) or None, got .yes."):
        HookErrors("x", strict="yes")  # type: ignore[arg-type]


def test_a_failing_event_of_the_watch_is_contained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ParamRecorder, "record_grads", broken)  # runs at every optimizer step
    model = mlp()
    with warnings.catch_warnings(record=True) as caught, watch(model, strict=False) as w:
        warnings.simplefilter("always")
        train(model)
    assert len(only_failure_warnings(caught)) == 1
    assert w.results().dropped["error"] == 3 and w.results().steps.tolist() == [0, 1, 2]


def test_activation_stats_contain_their_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ActivationStats, "_keep", broken)
    model = mlp()
    stats = ActivationStats(strict=False)
    with warnings.catch_warnings(record=True) as caught, stats.attach(model):
        warnings.simplefilter("always")
        train(model)
    assert len(only_failure_warnings(caught)) == 1
    assert stats.dropped_reasons["error"] == 3  # what a forward recorded is kept at its end: one failure each
    with pytest.raises(ArithmeticError), ActivationStats(strict=True).attach(model):
        train(model, steps=1)


def test_a_monitor_counts_its_reducers_failures_and_raises_the_users() -> None:
    layer = nn.Linear(2, 2)
    monitor = OutputMonitor(HistoryReducer(), module=layer, map_=lambda out: (out, out), strict=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            layer(torch.ones(1, 2))  # HistoryReducer takes one tensor: its push fails
    monitor.detach()
    assert monitor.counts["error"] == 3 and len(only_failure_warnings(caught)) == 1
    assert "counted in counts['error']" in str(only_failure_warnings(caught)[0].message)

    def users_filter(out: torch.Tensor) -> bool:
        raise ValueError("the user's bug")

    with (
        pytest.raises(
            RuntimeError, match=r"failed to record an observation: the user's bug \(in the filter_ of OutputMonitor"
        ),
        OutputMonitor(HistoryReducer(), module=layer, filter_=users_filter, strict=False),
    ):
        layer(torch.ones(1, 2))  # the user's own callable: raised even when not strict


def test_weight_monitors_contain_their_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hookscope.weights._change.weight_statistics", broken)
    monkeypatch.setenv("HOOKSCOPE_STRICT", "0")
    model = mlp()
    data = add_weight_distribution_monitor(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(model)
    data["remove"]()
    assert data["errors"].failures == 3 * 2 and len(only_failure_warnings(caught)) == 1


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11+")
def test_a_users_hook_failure_is_raised_as_it_is_naming_the_hook_and_the_module() -> None:
    model = mlp()

    def my_hook(module: nn.Module, args: object, output: object) -> None:
        raise ValueError("bad value in my hook")

    with scope(), pytest.raises(ValueError, match="bad value in my hook") as raised:
        register_module_hook(model[2], "forward", my_hook, path="2")
        train(model, steps=1)
    notes = getattr(raised.value, "__notes__", [])
    assert any("forward hook" in note and "my_hook" in note and "on 2" in note for note in notes), notes


class Owner:
    """An object whose hook failures count into its own list (as a monitor's count into its `counts`)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.errors = HookErrors("Owner", strict=False, count=self.count)

    def count(self, reason: str) -> None:
        self.seen.append(reason)


@pytest.mark.parametrize(
    "duplicate", [copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))], ids=["deepcopy", "pickle"]
)
def test_a_copy_of_an_owner_counts_failures_into_the_copy(duplicate: Any) -> None:
    owner = Owner()
    twin = duplicate(owner)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HookFailureWarning)
        twin.errors.failed(ArithmeticError("planted"), "a hook")
    assert twin.seen == ["error"] and owner.seen == []
    assert twin.errors.failures == 1 and owner.errors.failures == 0
