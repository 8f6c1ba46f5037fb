"""The seed's API, called exactly as the seed documents it (its README and its signatures), raises no warning.

The seed is the project's first release (the commits of its first day): its README's quick start, its top-level
names, its weight functions' `layer_names=` / `layer_types=`, `select_modules(selector=)` and
`MonitorPool(selector=)`, `StatsReducer.merge`, and the in-place `load(path)` of reducers, monitors and pools.
Every call runs under `warnings.simplefilter("error")`; its result is checked against a naive expectation.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import hookscope


@pytest.fixture(autouse=True)
def _no_warning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_the_seeds_quick_start() -> None:
    layers = [nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 3)]
    model = nn.Sequential(*layers)
    with hookscope.hook_outputs(layers, grad=True) as h:
        y = model(torch.randn(4, 5))
        y.pow(2).mean().backward()
    torch.testing.assert_close(h.stored[2][0], 2 * y.detach() / y.numel())
    fired: list[str] = []
    with hookscope.scope():
        for path, module in hookscope.select_modules(model, nn.Linear):
            hookscope.register_module_hook(module, "forward", lambda m, args, out, p=path: fired.append(p))
        assert [info.path for info in hookscope.list_hooks(model)] == ["0", "2"]
        model(torch.randn(1, 5))
    assert fired == ["0", "2"] and hookscope.list_hooks(model) == []


def test_the_seeds_top_level_names() -> None:
    from hookscope import Clamp, HookHandle, LoopDriver, MaxNorm, ModelSummary, register_constraint  # noqa: F401

    model = nn.Sequential(nn.Linear(3, 4))
    with hookscope.register_constraint(model, hookscope.MaxNorm(0.5), mode="forward"):
        model(torch.randn(2, 3))
        assert float(model[0].weight.detach().norm(dim=1).max()) <= 0.5 + 1e-6


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2), nn.Conv2d(1, 1, 1))


def test_the_seeds_weight_keywords() -> None:
    model = _model()
    change = hookscope.add_weight_change_monitor_hook(model, layer_names=["0"])
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert list(hookscope.compute_weight_changes(model, change)) == ["0"]
    distribution = hookscope.add_weight_distribution_monitor(model, layer_types=nn.Conv2d)
    assert distribution["layer_names"] == ["3"]
    handles = hookscope.add_weight_norm_constraint_hook(model, 1.0, layer_names="2")
    assert [h.path for h in handles] == ["2"]
    for remove in (change["remove"], distribution["remove"], *(h.remove for h in handles)):
        remove()
    assert hookscope.list_hooks(model) == []
    from hookscope.weights import get_weights, l2_penalty

    assert list(get_weights(model, layer_names=["2"])) == ["2"]
    expected = float(model[0].weight.detach().pow(2).sum())
    assert float(l2_penalty(model, layer_names="0").detach()) == pytest.approx(expected)


def test_the_seeds_selector_keyword() -> None:
    from hookscope.monitors import MonitorPool, OutputMonitor
    from hookscope.reducers import StatsReducer

    model = _model()
    assert [p for p, _ in hookscope.select_modules(model, selector=nn.ReLU)] == ["1"]
    with MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), model, selector="0") as pool:
        assert list(pool) == ["0"]


def test_the_seeds_merge_and_in_place_loads(tmp_path: Path) -> None:
    from hookscope.monitors import OutputMonitor
    from hookscope.reducers import StatsReducer

    a, b = StatsReducer(), StatsReducer()
    a.push(torch.tensor([1.0, 2.0]))
    b.push(torch.tensor([3.0]))
    a.merge(b)
    assert float(a.peek().mean) == pytest.approx(2.0)  # type: ignore[union-attr]
    path = a.save(tmp_path / "r.safetensors")
    restored = StatsReducer()
    restored.load(path)
    assert float(restored.peek().mean) == pytest.approx(2.0)  # type: ignore[union-attr]
    layer = nn.Linear(2, 2)
    with OutputMonitor(StatsReducer(), module=layer) as monitor:
        layer(torch.ones(1, 2))
    again = OutputMonitor(StatsReducer())
    again.load(monitor.save(tmp_path / "m.safetensors"))
    assert again.counts["recorded"] == 1


def test_the_seeds_training_snippets(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with hookscope.watch(model, opt) as w:
        for _ in range(3):
            opt.zero_grad()
            loss = model(torch.randn(4, 3)).pow(2).mean()
            loss.backward()
            opt.step()
            w.log_loss(loss)
    results = w.results()
    assert results.summary()
    hookscope.format_findings(hookscope.diagnose(results))
    stats = hookscope.ActivationStats(every=2)
    with stats.attach(model):
        for _ in range(3):
            model(torch.randn(4, 3)).sum().backward()
    assert len(stats.stats) == 2
    path = hookscope.save_state(tmp_path / "w.safetensors", w)
    hookscope.load_state(path, w)
