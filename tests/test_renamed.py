"""One selection keyword, `select`, in every signature of ours; the seed's keywords work beside it, without a warning.

`RENAMED` lists every entry point whose selection argument the seed named otherwise (`layer_names`, `layer_types`,
`selector`), with that name and a call that reads back which layers it chose. Each must choose the layers a naive
path filter expects with `select=`, give the same result, with no warning, under the seed's keyword, and refuse
both together with a `TypeError` that names both. fastai's vocabulary keeps fastai's names (`hook_outputs(modules)`,
`Hooks(ms)`, `HookCallback(modules=)`, `ActivationStats(modules=)`).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn

import hookscope
from hookscope.hooks import select_modules
from hookscope.monitors import MonitorPool, OutputMonitor
from hookscope.reducers import StatsReducer
from hookscope.weights import (
    DeadUnitDetector,
    MaxNorm,
    UpdateRatioMonitor,
    add_weight_change_monitor_hook,
    add_weight_distribution_monitor,
    add_weight_norm_constraint_hook,
    find_duplicate_units,
    get_weights,
    init_weights_,
    l1_penalty,
    l2_penalty,
    register_constraint,
    register_weight_decay,
    scale_weights_,
    spectral_stats,
    weight_distance,
)

OLD_NAMES = ("layer_names", "layer_types", "selector")


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1)


def _train(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(5, 3)).pow(2).mean().backward()
    optimizer.step()


def _expected_penalty(model: nn.Module, paths: list[str], power: int) -> float:
    """The naive oracle: sum over the chosen layers' weights of |w| (power 1) or w^2 (power 2)."""
    modules = dict(model.named_modules())
    return sum(float(modules[p].weight.detach().abs().pow(power).sum()) for p in paths)  # type: ignore[operator]


def _dead(model: nn.Module, **kw: Any) -> list[str]:
    with DeadUnitDetector(window=4).attach(model, **kw) as detector:
        model(torch.randn(5, 3))
    return sorted(detector.forwards())


def _ratio(model: nn.Module, **kw: Any) -> list[str]:
    optimizer = _optimizer(model)
    with UpdateRatioMonitor().attach(model, optimizer, **kw) as monitor:
        _train(model, optimizer)
    return sorted(monitor.latest())


def _pool(model: nn.Module, **kw: Any) -> list[str]:
    with MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), model, **kw) as pool:
        return sorted(pool)


def _paths_of(handles: Any) -> list[str]:
    with handles:
        return sorted(h.path for h in handles)


def _constrained(model: nn.Module, **kw: Any) -> list[str]:
    with register_constraint(model, MaxNorm(1.0), **kw) as handle:
        return sorted(handle.layer_names)


def _chosen(data: Any) -> list[str]:
    with data:
        return sorted(data["layer_names"])


Call = Callable[..., Any]
RENAMED: dict[str, tuple[str, Call, Call]] = {
    # name: (old keyword, call(model, **selection) -> the chosen paths or a result, naive expectation(model, paths))
    "get_weights": ("layer_names", lambda m, **kw: sorted(get_weights(m, **kw)), lambda m, p: p),
    "init_weights_": ("layer_names", lambda m, **kw: sorted(init_weights_(m, torch.nn.init.zeros_, **kw)), None),
    "scale_weights_": ("layer_names", lambda m, **kw: sorted(scale_weights_(m, 1.0, **kw)), None),
    "l1_penalty": (
        "layer_names",
        lambda m, **kw: float(l1_penalty(m, **kw).detach()),
        lambda m, p: _expected_penalty(m, p, 1),
    ),
    "l2_penalty": (
        "layer_names",
        lambda m, **kw: float(l2_penalty(m, **kw).detach()),
        lambda m, p: _expected_penalty(m, p, 2),
    ),
    "register_weight_decay": (
        "layer_names",
        lambda m, **kw: _paths_of(register_weight_decay(m, 0.1, lr=0.1, **kw)),
        None,
    ),
    "register_constraint": ("layer_names", _constrained, None),
    "add_weight_norm_constraint_hook": (
        "layer_names",
        lambda m, **kw: _paths_of(add_weight_norm_constraint_hook(m, 1.0, **kw)),
        None,
    ),
    "add_weight_change_monitor_hook": (
        "layer_names",
        lambda m, **kw: _chosen(add_weight_change_monitor_hook(m, **kw)),
        None,
    ),
    "add_weight_distribution_monitor": (
        "layer_types",
        lambda m, **kw: _chosen(add_weight_distribution_monitor(m, **kw)),
        None,
    ),
    "weight_distance": ("layer_names", lambda m, **kw: sorted(weight_distance(m, _model(), **kw)), None),
    "find_duplicate_units": ("layer_names", lambda m, **kw: sorted(find_duplicate_units(m, **kw)), None),
    "spectral_stats": ("layer_names", lambda m, **kw: sorted(spectral_stats(m, **kw)), None),
    "DeadUnitDetector.attach": ("layer_names", _dead, None),
    "UpdateRatioMonitor.attach": ("layer_names", _ratio, None),
    "select_modules": ("selector", lambda m, **kw: [p for p, _ in select_modules(m, **kw)], None),
    "MonitorPool": ("selector", _pool, None),
}


@pytest.mark.parametrize("name", list(RENAMED))
def test_select_chooses_what_a_path_filter_chooses(name: str) -> None:
    _, call, expected = RENAMED[name]
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the new name never warns
        result = call(model, select=["0", "4"])
    oracle = expected(model, ["0", "4"]) if expected else ["0", "4"]
    assert result == pytest.approx(oracle)


@pytest.mark.parametrize("name", list(RENAMED))
def test_the_seeds_keyword_gives_the_same_result_without_a_warning(name: str) -> None:
    old, call, _ = RENAMED[name]
    new = call(_model(), select="2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = call(_model(), **{old: "2"})
    assert again == new


@pytest.mark.parametrize("name", list(RENAMED))
def test_the_seeds_and_the_new_keyword_together_are_refused(name: str) -> None:
    old, call, _ = RENAMED[name]
    with pytest.raises(TypeError, match=rf"got both {old}= and select=; {old}= is another name of select="):
        call(_model(), **{old: "2", "select": "2"})


def test_the_new_keyword_by_position_and_the_old_by_name_are_refused() -> None:
    with pytest.raises(TypeError, match="get_weights\\(\\) got both layer_names= and select="):
        get_weights(_model(), "2", layer_names="0")  # type: ignore[call-arg]


def test_the_distribution_monitor_default_is_linear_and_conv2d_layers() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.LazyLinear(3), nn.ReLU(), nn.Conv1d(1, 1, 1))
    model(torch.randn(1, 1, 5, 5))
    default = add_weight_distribution_monitor(model)
    explicit = add_weight_distribution_monitor(model, select=(nn.Linear, nn.Conv2d))
    assert default["layer_names"] == explicit["layer_names"] == ["0", "2"]  # not the Conv1d
    default.remove()
    explicit.remove()
    assert hookscope.list_hooks(model) == []


def _public_signatures() -> dict[str, inspect.Signature]:
    from test_entry_points import entry_points

    found = {name: inspect.signature(value) for name, value in entry_points().items()}
    for cls in (DeadUnitDetector, UpdateRatioMonitor, hookscope.Watch):
        found[f"{cls.__name__}.attach"] = inspect.signature(cls.attach)
    return found


def test_no_public_signature_takes_an_old_selection_keyword() -> None:
    signatures = _public_signatures()
    assert len(signatures) > 100
    old = {f"{name}({p})" for name, sig in signatures.items() for p in sig.parameters if p in OLD_NAMES}
    assert old == set()
    # every renamed entry point takes `select`; the only other selection names are fastai's
    takes = {name for name, sig in signatures.items() if "select" in sig.parameters}
    assert {"get_weights", "register_constraint", "add_weight_distribution_monitor", "MonitorPool"} <= takes
    fastai = {name for name, sig in signatures.items() if {"modules", "ms"} & set(sig.parameters)}
    assert fastai == {"hook_outputs", "Hooks", "HookCallback", "ActivationStats"}
