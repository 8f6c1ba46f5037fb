"""add_weight_update_monitor_hook, restore_optimizer_step and analyze_weight_updates."""

from __future__ import annotations

import copy
import gc
import math
import weakref
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn as nn
from weights_support import forbid_host_sync, make_mlp, train_step

from hookscope.hooks import list_hooks
from hookscope.weights import add_weight_update_monitor_hook, analyze_weight_updates, restore_optimizer_step

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
OPTIMIZERS: dict[str, OptimizerFactory] = {
    "sgd_momentum": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True),
    "adam": lambda m: torch.optim.Adam(m.parameters(), lr=0.01),
    "adamw_amsgrad": lambda m: torch.optim.AdamW(m.parameters(), lr=0.01, amsgrad=True),
    "rmsprop": lambda m: torch.optim.RMSprop(m.parameters(), lr=0.01, momentum=0.5, centered=True),
}


def _assert_same(a: nn.Module, b: nn.Module, opt_a: torch.optim.Optimizer, opt_b: torch.optim.Optimizer) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name
    state_a, state_b = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    assert state_a.keys() == state_b.keys()
    for index, entries in state_a.items():
        assert entries.keys() == state_b[index].keys()
        for key, value in entries.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(state_b[index][key])), (index, key)


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_restore_then_step_equals_the_run_without_the_undone_step(kind: str) -> None:
    batches = [torch.randn(6, 4) for _ in range(5)]
    model = make_mlp()
    reference = copy.deepcopy(model)
    optimizer, reference_optimizer = OPTIMIZERS[kind](model), OPTIMIZERS[kind](reference)
    data = add_weight_update_monitor_hook(optimizer, log_interval=1)
    for batch in batches[:2]:
        train_step(model, optimizer, batch)
        train_step(reference, reference_optimizer, batch)
    train_step(model, optimizer, batches[2])  # the step to undo
    restore_optimizer_step(optimizer, data)
    _assert_same(model, reference, optimizer, reference_optimizer)  # bit for bit, state included
    for batch in batches[3:]:
        train_step(model, optimizer, batch)
        train_step(reference, reference_optimizer, batch)
    _assert_same(model, reference, optimizer, reference_optimizer)
    assert data["step"] == 4


@pytest.mark.parametrize("kind", ["sgd_momentum", "adam"])
def test_restoring_the_first_step_removes_the_state_it_created(kind: str) -> None:
    model = make_mlp()
    reference = copy.deepcopy(model)
    optimizer, reference_optimizer = OPTIMIZERS[kind](model), OPTIMIZERS[kind](reference)
    data = add_weight_update_monitor_hook(optimizer)
    train_step(model, optimizer, torch.randn(3, 4))
    restore_optimizer_step(optimizer, data)
    assert len(optimizer.state) == 0 and data["step"] == 0
    batch = torch.randn(3, 4)
    train_step(model, optimizer, batch)
    train_step(reference, reference_optimizer, batch)
    _assert_same(model, reference, optimizer, reference_optimizer)


def test_restore_errors() -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = add_weight_update_monitor_hook(optimizer)
    with pytest.raises(RuntimeError, match="restore_optimizer_step has nothing to restore"):
        restore_optimizer_step(optimizer, data)
    train_step(model, optimizer, torch.randn(2, 4))
    restore_optimizer_step(optimizer, data)
    with pytest.raises(RuntimeError, match="nothing to restore"):
        restore_optimizer_step(optimizer, data)
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="optimizer must be the one hook_data watches"):
        restore_optimizer_step(other, data)
    with pytest.raises(ValueError, match="hook_data must be the dict returned by add_weight_update_monitor_hook"):
        restore_optimizer_step(optimizer, {"step": 1})


def test_restore_after_add_param_group_is_refused() -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
    data = add_weight_update_monitor_hook(optimizer)
    train_step(model, optimizer, torch.randn(2, 4))
    optimizer.add_param_group({"params": list(model[2].parameters())})
    with pytest.raises(RuntimeError, match="optimizer must hold the same parameters as when the step was watched"):
        restore_optimizer_step(optimizer, data)


def test_records_on_steps_1_and_every_log_interval_against_an_oracle() -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.named_parameters(), lr=0.05, momentum=0.9)
    data = add_weight_update_monitor_hook(optimizer, log_interval=3)
    expected_ratios: dict[str, list[float]] = {}
    expected_norms: dict[str, list[float]] = {}
    for step in range(1, 8):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        train_step(model, optimizer, torch.randn(4, 4))
        for name, param in model.named_parameters():
            update = param.detach() - before[name]
            assert torch.equal(data["last_updates"][name], update)  # every step
            if step in (1, 4, 7):
                norm = update.norm().item()
                expected_norms.setdefault(name, []).append(norm)
                expected_ratios.setdefault(name, []).append(norm / param.detach().norm().item())
    assert data["step"] == 7
    assert data["param_names"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for name in expected_norms:
        assert data["update_norms"][name] == pytest.approx(expected_norms[name], rel=1e-5)
        assert data["update_history"][name] == pytest.approx(expected_ratios[name], rel=1e-5)
    restore_optimizer_step(optimizer, data)  # step 7 was recorded: its record goes too
    assert data["step"] == 6 and len(data["update_history"]["0.weight"]) == 2
    assert data["last_updates"] == {}


def test_names_fall_back_to_group_and_index_and_ratio_edge_cases() -> None:
    weight = nn.Parameter(torch.zeros(3))
    frozen = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([{"params": [weight]}, {"params": [frozen], "lr": 0.0}], lr=1.0)
    data = add_weight_update_monitor_hook(optimizer, log_interval=1)
    weight.grad, frozen.grad = torch.full((3,), -1.0), torch.ones(2)
    optimizer.step()  # weight moves from zero: ||W|| after = ||dW||; frozen does not move
    assert data["update_history"]["group0.param0"] == [1.0]
    assert data["update_history"]["group1.param0"] == [0.0]
    with torch.no_grad():
        weight.fill_(1.0)
    weight.grad = torch.ones(3)
    optimizer.step()  # back to zero: ||W|| after is 0 while ||dW|| is not
    assert data["update_history"]["group0.param0"][-1] == math.inf


def test_update_hooks_never_sync_and_can_be_removed() -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = add_weight_update_monitor_hook(optimizer, log_interval=1)
    batches = [torch.randn(2, 4) for _ in range(30)]
    with forbid_host_sync():
        for batch in batches:
            train_step(model, optimizer, batch)
    assert len(data["update_norms"]["group0.param0"]) == 30
    assert len([h for h in list_hooks() if h.kind.startswith("optimizer")]) >= 2
    data["remove"]()
    train_step(model, optimizer, batches[0])
    assert data["step"] == 30


def test_log_interval_must_be_positive() -> None:
    optimizer = torch.optim.SGD(make_mlp().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="log_interval must be an int >= 1, got 0"):
        add_weight_update_monitor_hook(optimizer, log_interval=0)
    with pytest.raises(TypeError, match=r"optimizer must be a torch.optim.Optimizer, got \[\]"):
        add_weight_update_monitor_hook([], 1)  # type: ignore[arg-type]


def test_hook_data_does_not_keep_the_optimizer_alive() -> None:
    gc.disable()
    try:
        model = make_mlp()
        optimizer = torch.optim.Adam(model.parameters())
        data = add_weight_update_monitor_hook(optimizer)
        train_step(model, optimizer, torch.randn(2, 4))
        reference = weakref.ref(optimizer)
        del optimizer
        assert reference() is None
        assert data["step"] == 1
    finally:
        gc.enable()


def test_analyze_weight_updates_against_numpy() -> None:
    history = {"a": [0.5, 1.0, 4.0, 2.0, 3.0], "b": [7.0], "c": [], "d": torch.tensor([1.0, 2.0, 3.0])}
    summary = analyze_weight_updates(history, window_size=3)
    assert set(summary) == {"a", "b", "d"}
    window = np.array([4.0, 2.0, 3.0])
    slope = np.polyfit(np.arange(3), window, 1)[0]
    expected = {"mean": 3.0, "std": window.std(ddof=1), "min": 2.0, "max": 4.0, "last": 3.0, "trend": slope}
    assert summary["a"] == pytest.approx(expected)
    assert summary["b"] == {"mean": 7.0, "std": 0.0, "min": 7.0, "max": 7.0, "last": 7.0, "trend": 0.0}
    assert summary["d"]["trend"] == pytest.approx(1.0)
    assert analyze_weight_updates(history, window_size=100)["a"]["mean"] == pytest.approx(np.mean(history["a"]))


def test_analyze_window_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window_size must be an int >= 1, got 0"):
        analyze_weight_updates({"a": [1.0]}, window_size=0)


def test_analyze_reads_the_monitor_history() -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.named_parameters(), lr=0.1)
    data = add_weight_update_monitor_hook(optimizer, log_interval=1)
    for _ in range(4):
        train_step(model, optimizer, torch.randn(2, 4))
    summary = analyze_weight_updates(data["update_history"], window_size=2)
    assert summary["2.bias"]["last"] == data["update_history"]["2.bias"][-1]
    assert summary["2.bias"]["mean"] == pytest.approx(np.mean(data["update_history"]["2.bias"][-2:]))


class _CountingSGD(torch.optim.SGD):
    """An optimizer that changes a group hyperparameter inside step, as some custom optimizers do."""

    def step(self, closure=None):  # type: ignore[no-untyped-def]
        for group in self.param_groups:
            group["calls"] = group.get("calls", 0) + 1
        return super().step(closure)


def test_restore_puts_back_hyperparameters_the_step_changed_but_keeps_a_schedulers_change() -> None:
    model = make_mlp()
    optimizer = _CountingSGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    data = add_weight_update_monitor_hook(optimizer)
    train_step(model, optimizer, torch.randn(2, 4))
    train_step(model, optimizer, torch.randn(2, 4))
    scheduler.step()
    restore_optimizer_step(optimizer, data)
    assert optimizer.param_groups[0]["calls"] == 1  # changed by the undone step: put back
    assert optimizer.param_groups[0]["lr"] == 0.05  # changed by the scheduler after it: kept
    first = _CountingSGD(make_mlp().parameters(), lr=0.1)
    first_data = add_weight_update_monitor_hook(first)
    first.step()
    restore_optimizer_step(first, first_data)
    assert "calls" not in first.param_groups[0]  # added by the undone step: removed


def test_a_subclass_calling_super_step_is_one_step() -> None:
    torch.optim.SGD(make_mlp().parameters(), lr=0.1)  # wraps SGD.step with torch's hook caller
    model = make_mlp()
    reference = copy.deepcopy(model)
    optimizer = _CountingSGD(model.parameters(), lr=0.1, momentum=0.9)  # its hooks now fire at both levels
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    data = add_weight_update_monitor_hook(optimizer, log_interval=1)
    batches = [torch.randn(2, 4) for _ in range(3)]
    for batch in batches[:2]:
        train_step(model, optimizer, batch)
        train_step(reference, reference_optimizer, batch)
    assert data["step"] == 2 and len(data["update_norms"]["group0.param0"]) == 2
    train_step(model, optimizer, batches[2])
    restore_optimizer_step(optimizer, data)
    _assert_same(model, reference, optimizer, reference_optimizer)
