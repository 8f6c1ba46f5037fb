"""Planted faults, recorded by the naive oracle: each must raise the right finding at the right layer and step."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from doctor_oracle import mlp, record, regression_batches, train

from hookscope.doctor import Finding, diagnose


def serious(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity != "info"]


def only(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


class FailAt(nn.Module):
    """Pass its input through, except on call number `at` (from 0) where it takes log(-1): NaN from finite input."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * torch.log(x * 0 - 1) if self.calls - 1 == self.at else x


class Sqrt(nn.Module):
    """sqrt: finite on the zeros a ReLU emits, but its gradient there is infinite."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sqrt()


@pytest.mark.parametrize("activation", [nn.ReLU, nn.Tanh])
def test_a_healthy_mlp_trained_normally_raises_no_warning(activation: type[nn.Module]) -> None:
    results = train(mlp(activation=activation), steps=60, lr=1e-3)
    assert float(results.losses[-5:].mean()) < 0.5 * float(results.losses[:5].mean())  # it really learns
    assert serious(diagnose(results)) == []


def test_a_nan_made_by_one_layer_is_blamed_on_that_layer_and_step() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), FailAt(3), nn.ReLU(), nn.Linear(16, 1))
    results = train(model, steps=6)
    findings = diagnose(results)
    assert findings[0].check == "nonfinite_forward" and findings[0].severity == "error"
    assert (findings[0].path, findings[0].step) == ("3", 3)
    assert findings[0].evidence["nonfinite"] == float(results.activations["3"]["nonfinite"][3]) == 64 * 16
    assert [f.path for f in only(findings, "nonfinite_forward")] == ["3"]
    assert results.first_nonfinite["backward"] is not None
    assert only(findings, "nonfinite_backward") == []  # the gradient of a NaN forward says nothing new


def test_without_recorded_provenance_the_per_step_counts_find_the_same_layer() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), FailAt(2), nn.ReLU(), nn.Linear(16, 1))
    results = train(model, steps=4)
    results.first_nonfinite = {"forward": None, "backward": None}
    (found,) = only(diagnose(results), "nonfinite_forward")
    assert (found.path, found.step) == ("3", 2)
    assert "forward order" in str(found.evidence["source"])


def test_a_nan_born_in_backward_is_blamed_on_the_layer_whose_output_gradient_broke() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Sqrt(), nn.Linear(16, 1))
    results = train(model, steps=3)
    findings = diagnose(results)
    # the ReLU's zeros make sqrt's gradient infinite: the ReLU ("1") is the first output gradient to break
    assert (findings[0].check, findings[0].path, findings[0].step) == ("nonfinite_backward", "1", 0)
    assert math.isfinite(float(results.activations["2"]["max"][0]))  # the forward of step 0 was finite
    assert float(results.output_grads["0"]["nonfinite"][0]) == 0  # the ReLU's backward masks it again
    assert only(findings, "nonfinite_forward") == []


class ZeroNorm(nn.Module):
    """x + 0 * sqrt(sum((x - x)^2)): the forward is x exactly, the backward of sqrt at 0 gives 0 * inf = NaN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0 * (x - x).pow(2).sum().sqrt()


def test_a_backward_nan_ranks_before_the_forward_nan_it_causes() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), ZeroNorm(), nn.Linear(16, 1))
    results = train(model, steps=3)
    first, second = diagnose(results)[:2]
    assert (first.check, first.path, first.step) == ("nonfinite_backward", "1", 0)
    assert (second.check, second.path, second.step) == ("nonfinite_forward", "0", 1)  # NaN weights after step 0


def test_a_nan_only_in_the_loss_is_blamed_on_the_loss() -> None:
    model = mlp()
    results = record(model, None, regression_batches(), lambda out, y: torch.log(out - 1e3).mean(), 2)
    (found,) = only(diagnose(results), "nonfinite_forward")
    assert found.path is None and found.step == 0 and "loss" in found.message


def test_a_learning_rate_100x_too_high_is_reported_from_the_first_step() -> None:
    torch.manual_seed(0)
    healthy = train(mlp(), steps=5, lr=1e-3)
    torch.manual_seed(0)
    results = train(mlp(), steps=5, lr=1e-1)
    (found,) = only(diagnose(results), "lr_too_high")
    assert found.path is None and found.step == 0
    weights = [results.update_ratios[n][:3].median() for n in ("0.weight", "2.weight", "4.weight")]  # steps 0-2
    assert found.evidence["median_ratio"] == pytest.approx(float(torch.stack(weights).median()), rel=1e-6)
    assert only(diagnose(healthy), "lr_too_high") == []


def test_a_learning_rate_far_too_low_is_reported() -> None:
    results = train(mlp(), steps=5, lr=1e-5, optimizer="sgd")
    (found,) = only(diagnose(results), "lr_too_low")
    assert found.evidence["fraction"] == 1.0 and float(found.evidence["median_ratio"]) < 1e-5


def test_a_bias_that_kills_a_relu_layer_is_reported_at_that_relu() -> None:
    model = mlp(width=32)
    nn.init.constant_(model[2].bias, -10.0)
    results = train(model, steps=10)
    (found,) = only(diagnose(results), "dead_units")
    assert (found.path, found.severity) == ("3", "error")
    assert found.evidence == {
        "dead": 32, "never": 32, "units": 32, "fraction": 1.0, "activity_below": 0.01, "input_layer": "2"
    }  # fmt: skip


def test_constant_initialization_leaves_symmetry_unbroken() -> None:
    model = mlp(width=16)
    for layer in model:
        if isinstance(layer, nn.Linear):
            nn.init.constant_(layer.weight, 0.05)
            nn.init.zeros_(layer.bias)
    results = train(model, steps=10)
    for path in ("0", "2"):  # after training, every row of the weights is still the same
        assert torch.allclose(model[int(path)].weight, model[int(path)].weight[:1].expand_as(model[int(path)].weight))
    found = {f.path: f for f in only(diagnose(results), "symmetry")}
    assert sorted(found) == ["0", "2"]
    assert all(f.severity == "error" and f.evidence["identical"] == f.evidence["units"] == 16 for f in found.values())


def test_tanh_saturated_by_huge_weights_is_reported_at_that_tanh() -> None:
    model = mlp(activation=nn.Tanh)
    nn.init.normal_(model[2].weight, std=5.0)
    results = train(model, steps=6)
    (found,) = only(diagnose(results), "saturation")
    assert found.path == "3" and found.step == 0
    assert found.evidence["fraction"] == pytest.approx(float(results.activations["3"]["saturated"][:3].median()))
    assert float(results.activations["1"]["saturated"][:3].median()) < 0.5  # the tanh before is fine


def _init_stack(depth: int, std: float) -> nn.Sequential:
    model = mlp(width=32, depth=depth)
    for layer in model:
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, std=std)
            nn.init.zeros_(layer.bias)
    return model


def test_a_deep_stack_with_tiny_init_collapses_and_its_gradients_vanish() -> None:
    results = train(_init_stack(depth=8, std=0.01), steps=4)
    findings = diagnose(results)
    (init,) = only(findings, "bad_init")
    std = {p: float(s["std"][0]) for p, s in results.activations.items()}
    order = list(results.layers)
    assert init.evidence["direction"] == "collapse" and init.step == 0
    assert std[init.path] <= std[str(init.evidence["from_layer"])] / 1e3  # fallen three decades ...
    before = order[: order.index(init.path)]
    assert all(std[p] > max(std[q] for q in before[: i + 1]) / 1e3 for i, p in enumerate(before))  # ... first here
    (vanish,) = [f for f in only(findings, "vanishing_gradients") if f.evidence["across"] == "depth"]
    # Oracle, over the first 3 steps: each layer's gradient against the last layer of its type (Linear "16",
    # ReLU "15"), and whether the weights it reaches first (its own, else the Linear before it) still learn.
    grads = {p: s["norm"][:3].double() for p, s in results.output_grads.items()}
    last = {kind: [p for p in order if results.layers[p] == kind][-1] for kind in ("Linear", "ReLU")}
    linears = [p for p in order if results.layers[p] == "Linear"]
    moved = {p: float(results.update_ratios[f"{p}.weight"][:3].median()) for p in linears}
    typical = float(torch.tensor(list(moved.values())).median())
    stalled = {p: moved[p if p in moved else str(int(p) - 1)] <= max(1e-5, typical / 1e3) for p in order}
    crossed = [p for p in order if float((grads[p] / grads[last[results.layers[p]]]).median()) <= 1e-3 and stalled[p]]
    assert vanish.path == crossed[-1] and vanish.evidence["reference"] == last[results.layers[vanish.path]]
    assert not stalled["10"] and float((grads["10"] / grads["16"]).median()) <= 1e-3  # small, yet Adam moves it


def test_a_deep_stack_with_huge_init_blows_up_and_its_gradients_explode() -> None:
    results = train(_init_stack(depth=5, std=2.0), steps=3)
    findings = diagnose(results)
    (init,) = only(findings, "bad_init")
    assert init.evidence["direction"] == "blow-up"
    assert float(init.evidence["std"]) >= 1e3 * float(init.evidence["from_std"])
    assert any(f.evidence["across"] == "depth" for f in only(findings, "exploding_gradients"))
