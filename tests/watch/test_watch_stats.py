"""watch(): every statistic against a naive computation on the same hooked outputs, gradients and weights."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn

from hookscope.callbacks import HookCallback, LoopDriver
from hookscope.results._results import ACTIVATION_STATS
from hookscope.watch import Watch, watch
from stats_oracle import auto_exponent, auto_histogram, values_of

# The oracle's full backward hooks see modules whose inputs need no gradient; torch warns about that.
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


class Capture(HookCallback):
    """CPU copies of every output (or output gradient) of the hooked modules, per training batch."""

    def __init__(self, modules: Any = None, is_forward: bool = True) -> None:
        super().__init__(modules=modules, is_forward=is_forward, cpu=True)
        self.batches: list[list[list[torch.Tensor]]] = []

    def on_batch_start(self, batch: int) -> None:
        self.batches.append([[] for _ in self.paths])

    def hook(self, m: nn.Module, i: Any, o: Any) -> Any:
        self.batches[-1][self.hooked_modules.index(m)].append(o.float() if self.is_forward else o[0].float())


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))


PATHS = ["0", "1", "2", "3", "4"]


def run(model: nn.Module, w: Watch, steps: int, oracle: dict[str, list[Any]] | None = None) -> list[Capture]:
    """Train `steps` SGD steps with `w` and two captures driven by one driver; fill `oracle` from the loop."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    forward, backward = Capture(modules=PATHS), Capture(modules=PATHS, is_forward=False)
    params = dict(model.named_parameters())
    with LoopDriver([forward, backward, w], model, opt):
        for _ in range(steps):
            loss = model(torch.randn(32, 3) * 2).pow(2).mean()
            w.log_loss(loss)
            loss.backward()
            before = {n: p.detach().clone() for n, p in params.items()}
            if oracle is not None:
                oracle["loss"].append(float(loss.detach()))
                oracle["grad"].append({n: float(p.grad.norm()) for n, p in params.items()})
            opt.step()
            if oracle is not None:
                oracle["ratio"].append(
                    {n: float((p.detach() - before[n]).norm() / p.detach().norm()) for n, p in params.items()}
                )
            opt.zero_grad()
    return [forward, backward]


def test_activation_statistics_match_the_outputs() -> None:
    model = mlp()
    w = watch(model, select=PATHS)
    forward, _ = run(model, w, steps=3)
    results = w.results()
    assert results.steps.tolist() == [0, 1, 2]
    assert list(results.layers.items()) == [
        ("0", "Linear"), ("1", "ReLU"), ("2", "Linear"), ("3", "Tanh"), ("4", "Linear"),
    ]  # fmt: skip
    for j, path in enumerate(PATHS):
        stats = results.activations[path]
        assert set(stats) == set(ACTIVATION_STATS)
        for k in range(3):
            x = torch.cat([t.reshape(-1) for t in forward.batches[k][j]]).double()
            expected = {
                "mean": x.mean(), "std": x.std(), "rms": x.pow(2).mean().sqrt(), "min": x.min(), "max": x.max(),
                "near_zero": (x.abs() <= 1e-3).double().mean(), "nonfinite": torch.tensor(0.0),
            }  # fmt: skip
            for name, value in expected.items():
                assert float(stats[name][k]) == pytest.approx(float(value), rel=1e-4, abs=1e-6), (path, name, k)
            if path == "3":
                assert float(stats["saturated"][k]) == pytest.approx(float((x.abs() >= 0.98).double().mean()))
            else:
                assert math.isnan(float(stats["saturated"][k]))


def test_histograms_count_every_value_on_the_range_the_whole_run_needed() -> None:
    model = mlp()
    w = watch(model, select=PATHS, hist_bins=16)
    forward, _ = run(model, w, steps=3)
    results = w.results()
    for j, path in enumerate(PATHS):
        steps = [values_of(*forward.batches[k][j]) for k in range(3)]
        exponent = auto_exponent(np.concatenate(steps))
        assert exponent is not None
        edges = results.hist_edges[path]
        assert edges.shape == (17,) and float(edges[-1]) == 2.0**exponent == -float(edges[0])
        for k in range(3):
            assert results.histograms[path][k].tolist() == auto_histogram(steps[k], 16, exponent).tolist()
            assert float(results.histograms[path][k].sum()) == steps[k].size  # no value clamped or lost


def test_gradient_norms_update_ratios_and_losses_match_the_loop() -> None:
    model = mlp()
    w = watch(model, select=PATHS)
    oracle: dict[str, list[Any]] = {"loss": [], "grad": [], "ratio": []}
    _, backward = run(model, w, steps=3, oracle=oracle)
    results = w.results()
    for j, path in enumerate(PATHS):
        for k in range(3):
            grad = torch.cat([t.reshape(-1) for t in backward.batches[k][j]])
            assert float(results.output_grads[path]["norm"][k]) == pytest.approx(float(grad.norm()), rel=1e-4)
            assert float(results.output_grads[path]["nonfinite"][k]) == 0
    assert sorted(results.param_grads) == sorted(oracle["grad"][0])
    for k in range(3):
        for name in oracle["grad"][k]:
            assert float(results.param_grads[name]["norm"][k]) == pytest.approx(oracle["grad"][k][name], rel=1e-5)
            assert float(results.update_ratios[name][k]) == pytest.approx(oracle["ratio"][k][name], rel=1e-4)
    assert results.losses is not None
    assert results.losses.tolist() == pytest.approx(oracle["loss"])


def test_unit_activity_is_the_fraction_of_positive_values_per_unit() -> None:
    model = mlp()
    w = watch(model, select=PATHS)
    forward, _ = run(model, w, steps=2)
    results = w.results()
    for j, path in enumerate(PATHS):
        x = torch.cat([t for k in range(2) for t in forward.batches[k][j]])
        torch.testing.assert_close(results.unit_activity[path], (x > 0).double().mean(0))


def test_unit_activity_of_4d_outputs_is_per_channel() -> None:
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU())
    w, capture = Watch(), Capture(modules=["0", "1"])
    with LoopDriver([capture, w], model):
        model(torch.randn(4, 2, 6, 6))
    x = capture.batches[0][1][0]
    torch.testing.assert_close(w.results().unit_activity["1"], (x > 0).double().mean((0, 2, 3)))


def test_identical_units_are_read_from_the_weights() -> None:
    model = mlp()
    nn.init.constant_(model[2].weight, 0.1)
    nn.init.zeros_(model[2].bias)
    with torch.no_grad():
        model[4].weight[1] = model[4].weight[0]
        model[4].bias[1] = model[4].bias[0]
    with watch(model) as w:
        model(torch.randn(2, 3))
    assert w.results().identical_units == {"0": 0, "2": 16, "4": 2}


def test_every_records_one_step_in_n_and_counts_the_others() -> None:
    model = mlp()
    with watch(model, every=4, select="0") as w:
        for _ in range(10):
            model(torch.randn(2, 3))
    results = w.results()
    assert results.steps.tolist() == [0, 4, 8]
    assert results.dropped["sampling"] == 7


def test_steps_are_optimizer_steps_when_an_optimizer_is_given() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    capture = Capture(modules=["0"])
    w = watch(model, opt, select="0")
    with LoopDriver([capture, w], model, opt):
        for _ in range(2):
            for _ in range(3):  # gradient accumulation: three forwards per step
                model(torch.randn(4, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
    results = w.results()
    assert results.steps.tolist() == [0, 1]
    x = torch.cat([t.reshape(-1) for k in (3, 4, 5) for t in capture.batches[k][0]])
    assert float(results.activations["0"]["mean"][1]) == pytest.approx(float(x.mean()), rel=1e-4, abs=1e-6)
    assert float(results.activations["0"]["std"][1]) == pytest.approx(float(x.std()), rel=1e-4)


def test_eval_forwards_are_not_recorded() -> None:
    model = mlp()
    with watch(model, select="0") as w:
        model(torch.randn(2, 3))
        model.eval()
        model(torch.full((2, 3), 1e3))
    results = w.results()
    assert results.steps.tolist() == [0] and float(results.activations["0"]["max"][0]) < 100
    assert results.dropped == {"eval": 1}


def test_train_only_false_records_eval_forwards_as_steps() -> None:
    model = mlp().eval()
    with watch(model, select="0", train_only=False) as w:
        model(torch.randn(2, 3))
    assert w.results().steps.tolist() == [0]


def test_many_steps_flush_through_small_buffers_and_thin_past_capacity() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    with watch(model, buffer_steps=3, capacity=8, every=1) as w:
        for i in range(20):
            model(torch.full((1, 2), float(i)))
    results = w.results()
    assert results.steps.tolist() == [0, 4, 8, 12, 16, 19]  # thinned to every 4th step, and the last one
    assert results.meta["stride"] == 4
    # every step is measured (every=1), then kept or counted as thinned ("capacity"): 20 = 6 + 14
    assert results.dropped == {"capacity": 14}
    with torch.no_grad():
        expected = [float(model(torch.full((1, 2), float(s))).mean()) for s in results.steps.tolist()]
    assert results.activations["0"]["mean"].tolist() == pytest.approx(expected, rel=1e-5)


def test_fp16_and_bf16_outputs_are_accumulated_in_fp32() -> None:
    for dtype in (torch.float16, torch.bfloat16):
        model = nn.Sequential(nn.Identity())
        with watch(model, select="0") as w:
            model(torch.full((4096, 2), 300.0, dtype=dtype))
        stats = w.results().activations["0"]
        assert float(stats["mean"][0]) == 300.0 and float(stats["rms"][0]) == 300.0 and float(stats["std"][0]) == 0.0
