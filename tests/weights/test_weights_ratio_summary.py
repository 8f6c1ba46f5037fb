"""UpdateRatioMonitor, print_weight_summary, and the fixed API in a training loop."""

from __future__ import annotations

import doctest

import pytest
import torch
import torch.nn as nn
from weights_support import forbid_host_sync, make_mlp, train_step

import hookscope.weights as weights
from hookscope.hooks import list_hooks
from hookscope.weights import (
    UpdateRatioMonitor,
    add_weight_change_monitor_hook,
    add_weight_distribution_monitor,
    add_weight_norm_constraint_hook,
    add_weight_update_monitor_hook,
    analyze_weight_updates,
    compute_weight_changes,
    detect_weight_symmetry_breaking,
    print_weight_summary,
    restore_optimizer_step,
)


class _ListReducer:
    """The smallest reducer contract: push(tensor)."""

    def __init__(self) -> None:
        self.pushed: list[torch.Tensor] = []

    def push(self, value: torch.Tensor) -> None:
        self.pushed.append(value)


def test_ratio_monitor_matches_a_hand_computed_ratio_every_step() -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    monitor = UpdateRatioMonitor(capacity=3, reducer_factory=_ListReducer).attach(model, optimizer)
    expected: list[dict[str, float]] = []
    for _ in range(5):
        before = {p: model.get_submodule(p).weight.detach().clone() for p in ("0", "2")}
        train_step(model, optimizer, torch.randn(4, 4))
        expected.append({
            p: ((model.get_submodule(p).weight - before[p]).norm() / model.get_submodule(p).weight.norm()).item()
            for p in ("0", "2")
        })  # fmt: skip
    assert monitor.steps == 5 and monitor.dropped == 2
    history = monitor.history()
    for path in ("0", "2"):
        assert history[path] == pytest.approx([e[path] for e in expected[-3:]], rel=1e-5)
        assert [r.item() for r in monitor.reducers[path].pushed] == pytest.approx([e[path] for e in expected], rel=1e-5)
    assert monitor.latest() == pytest.approx(expected[-1], rel=1e-5)
    assert monitor.ratios().shape == (3, 2)


def test_ratio_monitor_never_syncs_and_diagnoses_learning_rates() -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD([{"params": model[0].parameters(), "lr": 10.0},
                                 {"params": model[2].parameters(), "lr": 1e-9}])  # fmt: skip
    with UpdateRatioMonitor(capacity=None).attach(model, optimizer) as monitor, forbid_host_sync():
        for _ in range(10):
            train_step(model, optimizer, torch.randn(4, 4))
    assert not any(h.owner is monitor for h in list_hooks())
    assert monitor.diagnose() == {"0": "too high", "2": "too low"}
    with pytest.raises(ValueError, match="low and high must satisfy 0 < low < high"):
        monitor.diagnose(low=1.0, high=0.5)


def test_ratio_monitor_state_dict_resumes_the_history() -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = UpdateRatioMonitor(capacity=4).attach(model, optimizer)
    for _ in range(6):
        train_step(model, optimizer, torch.randn(2, 4))
    state = monitor.state_dict()
    monitor.detach()
    resumed = UpdateRatioMonitor(capacity=4)
    resumed.load_state_dict(state)
    assert resumed.history() == monitor.history() and resumed.steps == 6 and resumed.dropped == 2
    resumed.attach(model, optimizer)
    train_step(model, optimizer, torch.randn(2, 4))
    assert resumed.steps == 7 and resumed.history()["0"][:3] == monitor.history()["0"][1:]
    with pytest.raises(ValueError, match="state must be for capacity 5"):
        UpdateRatioMonitor(capacity=5).load_state_dict(state)


def test_ratio_monitor_argument_errors() -> None:
    model = make_mlp()
    with pytest.raises(ValueError, match="capacity must be a positive int or None, got 0"):
        UpdateRatioMonitor(capacity=0)
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
    with pytest.raises(ValueError, match="select must choose layers whose weights the optimizer updates"):
        UpdateRatioMonitor().attach(model, optimizer, "2")
    monitor = UpdateRatioMonitor().attach(model, optimizer)
    assert monitor.layer_names == ["0"]
    with pytest.raises(RuntimeError, match="already attached"):
        monitor.attach(model, optimizer)


def test_summary_table_is_sorted_and_marks_missing_statistics(capsys: pytest.CaptureFixture[str]) -> None:
    changes = {"a": 0.5, "b": 2.0, "c": float("nan"), "d": 0.1}
    stats = {"b": {"mean": 0.25, "std": 1.0}, "a": {"mean": -0.125}}
    print_weight_summary(changes, stats, top_k=3)
    assert capsys.readouterr().out == (
        "#  layer  change    mean  std\n"
        "-  -----  ------  ------  ---\n"
        "1  c         nan       -    -\n"
        "2  b           2    0.25    1\n"
        "3  a         0.5  -0.125    -\n"
    )
    print_weight_summary({}, {})
    assert capsys.readouterr().out == "No weight changes to show.\n"
    with pytest.raises(ValueError, match="top_k must be an int >= 1, got 0"):
        print_weight_summary(changes, stats, top_k=0)


def test_fixed_api_in_a_training_loop(capsys: pytest.CaptureFixture[str]) -> None:
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.named_parameters(), lr=1e-2)
    changes = add_weight_change_monitor_hook(model)
    distribution = add_weight_distribution_monitor(model, max_history=50)
    updates = add_weight_update_monitor_hook(optimizer, log_interval=2)
    add_weight_norm_constraint_hook(model, max_norm=1.0)
    for step in range(6):
        train_step(model, optimizer, torch.randn(8, 4))
        if step == 4:
            restore_optimizer_step(optimizer, updates)  # e.g. the loss spiked: undo that step
    assert updates["step"] == 5
    assert len(updates["update_history"]["0.weight"]) == 3  # steps 1, 3, 5
    summary = analyze_weight_updates(updates["update_history"], window_size=5)
    assert set(summary) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert detect_weight_symmetry_breaking(model) == {"0": True, "2": True}
    print_weight_summary(compute_weight_changes(model, changes, "relative"), distribution["stats"], top_k=2)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["#", "layer", "change", "mean", "std", "min", "max", "norm", "abs_mean",
                                "zero_fraction"]  # fmt: skip
    assert len(lines) == 4


def test_docstring_examples_run() -> None:
    for module in (weights._change, weights._dead, weights._ratio):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0, module.__name__
