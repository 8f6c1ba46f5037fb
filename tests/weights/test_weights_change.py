"""add_weight_change_monitor_hook, compute_weight_changes, weight_distance, add_weight_distribution_monitor."""

from __future__ import annotations

import gc
import math
import weakref

import numpy as np
import pytest
import torch
import torch.nn as nn
from weights_support import forbid_host_sync, make_mlp

from hookscope.hooks import list_hooks
from hookscope.weights import (
    add_weight_change_monitor_hook,
    add_weight_distribution_monitor,
    compute_weight_changes,
    weight_distance,
)
from hookscope.weights._change import STAT_NAMES


def _oracle(w: np.ndarray, w0: np.ndarray, metric: str) -> float:
    d = (w - w0).ravel()
    if metric == "norm":
        return float(np.sqrt((d**2).sum()))
    if metric == "relative":
        return float(np.sqrt((d**2).sum()) / np.sqrt((w0**2).sum()))
    if metric == "max":
        return float(np.abs(d).max())
    if metric == "mean":
        return float(np.abs(d).mean())
    a, b = w.ravel(), w0.ravel()
    return float(1 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("metric", ["norm", "relative", "max", "mean", "cosine"])
def test_changes_match_numpy_after_training(metric: str) -> None:
    model = make_mlp()
    data = add_weight_change_monitor_hook(model)
    before = {p: m.weight.detach().double().numpy().copy() for p, m in (("0", model[0]), ("2", model[2]))}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    changes = compute_weight_changes(model, data, metric)
    assert list(changes) == ["0", "2"] == data["layer_names"]
    for path, module in (("0", model[0]), ("2", model[2])):
        expected = _oracle(module.weight.detach().double().numpy(), before[path], metric)
        assert changes[path] == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert expected > 0


def test_snapshot_is_a_detached_copy_and_unchanged_weights_give_zero() -> None:
    model = nn.Linear(3, 2)
    data = add_weight_change_monitor_hook(model)
    snapshot = data["initial_weights"][""]
    assert snapshot is not model.weight and not snapshot.requires_grad
    assert data["handles"] == [] and callable(data["remove"])
    assert compute_weight_changes(model, data) == {"": 0.0}
    assert compute_weight_changes(model, data, "cosine") == {"": 0.0}


def test_relative_and_cosine_edge_cases_with_zero_weights() -> None:
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    data = add_weight_change_monitor_hook(model)
    assert compute_weight_changes(model, data, "relative") == {"": 0.0}  # both zero
    assert compute_weight_changes(model, data, "cosine") == {"": 0.0}
    with torch.no_grad():
        model.weight.fill_(1.0)
    assert compute_weight_changes(model, data, "relative") == {"": math.inf}  # only W0 zero
    assert compute_weight_changes(model, data, "cosine") == {"": 1.0}


def test_layer_selection_by_glob_and_type() -> None:
    model = make_mlp()
    assert add_weight_change_monitor_hook(model, "2")["layer_names"] == ["2"]
    assert add_weight_change_monitor_hook(model, ["0", "2"])["layer_names"] == ["0", "2"]
    assert add_weight_change_monitor_hook(model, nn.Linear)["layer_names"] == ["0", "2"]


def test_unknown_layer_paths_list_close_names() -> None:
    model = nn.Sequential()
    model.add_module("encoder", nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"select must name an existing module path, got 'encodr'.*'encoder'"):
        add_weight_change_monitor_hook(model, "encodr")
    with pytest.raises(ValueError, match="must choose at least one module with a weight"):
        add_weight_change_monitor_hook(nn.Sequential(nn.ReLU(), nn.Linear(2, 2)), "0")


def test_unknown_metric_names_the_valid_ones() -> None:
    model = nn.Linear(2, 2)
    data = add_weight_change_monitor_hook(model)
    with pytest.raises(ValueError, match="metric must be one of 'norm', 'relative', 'max', 'mean', 'cosine', got 'l3'"):
        compute_weight_changes(model, data, "l3")


def test_removed_snapshot_and_missing_layer_raise() -> None:
    model = make_mlp()
    data = add_weight_change_monitor_hook(model)
    with pytest.raises(ValueError, match="must name an existing layer path, got '2'"):
        compute_weight_changes(nn.Sequential(nn.Linear(4, 8)), data)
    data["remove"]()
    with pytest.raises(RuntimeError, match="hook_data has no snapshot"):
        compute_weight_changes(model, data)
    data["reset"]()
    assert compute_weight_changes(model, data) == {"0": 0.0, "2": 0.0}


def test_shape_change_is_reported() -> None:
    data = add_weight_change_monitor_hook(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ValueError, match=r"must keep its weight shape \(2, 2\) to be compared, got \(3, 2\)"):
        compute_weight_changes(nn.Sequential(nn.Linear(2, 3)), data)


def test_weight_distance_between_models() -> None:
    a, b = make_mlp(), make_mlp()
    distance = weight_distance(a, b, "norm")
    for path in ("0", "2"):
        expected = (a.get_submodule(path).weight.double() - b.get_submodule(path).weight.double()).norm().item()
        assert distance[path] == pytest.approx(expected, rel=1e-12)
    assert weight_distance(a, a, "max") == {"0": 0.0, "2": 0.0}
    with pytest.raises(
        ValueError, match=r"(?s)reference must have the chosen layers of the model, got Sequential.* no layer '2'"
    ):
        weight_distance(a, nn.Sequential(nn.Linear(4, 8)))


def test_distribution_stats_match_a_naive_oracle() -> None:
    model = make_mlp()
    with torch.no_grad():
        model[0].weight[0, :2] = 0.0
    data = add_weight_distribution_monitor(model)
    model(torch.randn(2, 4))
    stats = data["stats"]
    assert set(stats) == {"0", "2"}
    w = model[0].weight.detach().double().numpy().ravel()
    expected = {
        "mean": w.mean(), "std": w.std(ddof=1), "min": w.min(), "max": w.max(), "norm": np.linalg.norm(w),
        "abs_mean": np.abs(w).mean(), "zero_fraction": 2 / w.size,
    }  # fmt: skip
    assert list(stats["0"]) == list(STAT_NAMES)
    for key, value in expected.items():
        assert stats["0"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert all(isinstance(v, float) for v in stats["0"].values())


def test_distribution_history_is_bounded_and_counts_dropped() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    data = add_weight_distribution_monitor(model, max_history=3)
    means = []
    for step in range(5):
        with torch.no_grad():
            model[0].weight.fill_(float(step))
        model(torch.randn(1, 2))
        means.append(float(step))
    history = data["history"]["0"]
    assert [h["mean"] for h in history] == means[-3:]
    assert data["dropped"]["0"] == 2
    assert data["stats"]["0"]["mean"] == 4.0


def test_distribution_hook_never_syncs_and_one_element_std_is_zero() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1, bias=False), nn.Linear(1, 1))
    data = add_weight_distribution_monitor(model)
    with forbid_host_sync():
        for _ in range(20):
            model(torch.randn(2, 3))
    assert len(data["history"]["0"]) == 20
    assert data["stats"]["2"]["std"] == 0.0  # a 1x1 weight: no NaN from a one-element std


def test_distribution_reads_fp16_weights_in_float32() -> None:
    model = nn.Sequential(nn.Linear(64, 64)).half()
    with torch.no_grad():
        model[0].weight.fill_(300.0)
    data = add_weight_distribution_monitor(model)
    model[0]._forward_hooks[next(iter(model[0]._forward_hooks))](model[0], (), None)  # fp16 matmul is CPU-slow
    stats = data["stats"]["0"]
    assert stats["norm"] == pytest.approx(300.0 * 64, rel=1e-6)  # 19200 overflows nothing in float32
    assert stats["mean"] == 300.0 and stats["std"] == 0.0


def test_distribution_remove_and_argument_errors() -> None:
    model = make_mlp()
    data = add_weight_distribution_monitor(model, nn.Linear)
    assert len(list_hooks(model)) == 2
    data["remove"]()
    assert len(list_hooks(model)) == 0
    model(torch.randn(1, 4))
    assert dict(data["stats"]) == {}
    with pytest.raises(ValueError, match="max_history must be a positive int, got 0"):
        add_weight_distribution_monitor(model, max_history=0)
    with pytest.raises(TypeError, match="select must be None, a path or glob, .* got 3"):
        add_weight_distribution_monitor(model, 3)
    with pytest.raises(ValueError, match=r"select must match at least one module .* got <class .*Conv1d.*\['Linear'\]"):
        add_weight_distribution_monitor(model, nn.Conv1d)


def test_distribution_monitor_does_not_keep_the_model_alive() -> None:
    gc.disable()
    try:
        model = make_mlp()
        data = add_weight_distribution_monitor(model)
        model(torch.randn(1, 4))
        reference = weakref.ref(model)
        del model
        assert reference() is None
        assert set(data["stats"]) == {"0", "2"}  # what was recorded stays readable
    finally:
        gc.enable()
