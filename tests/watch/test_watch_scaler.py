"""watch(..., scaler=): output-gradient norms without the loss scale, and a skipped step as a step of its own."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from hookscope.results import WatchResults
from hookscope.watch import Watch, watch


def _oracle_output_grad_norms(model: nn.Sequential, x: torch.Tensor) -> list[float]:
    """Norms of d loss / d output of each child, unscaled, from a copy of the model (not watched)."""
    twin = copy.deepcopy(model)
    outputs, h = [], x
    for child in twin:
        h = child(h)
        outputs.append(h)
    loss = h.pow(2).mean()
    return [g.norm().item() for g in torch.autograd.grad(loss, outputs)]


def _train(steps: int, bad: set[int]) -> tuple[Watch, dict[str, list[float]]]:
    """Train `steps` steps under a GradScaler, the loss made infinite at the steps in `bad` (the scaler skips
    them); return the watch and the oracle's norms per step (NaN parameter norms at skipped steps)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)  # the scale changes every step
    expected: dict[str, list[float]] = {"out0": [], "out2": [], "weight0": []}
    w = watch(model, optimizer, scaler=scaler)
    with w:
        for step in range(steps):
            x = torch.randn(8, 4)
            norms = _oracle_output_grad_norms(model, x)
            expected["out0"].append(norms[0])
            expected["out2"].append(norms[2])
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            scaler.scale(loss * (math.inf if step in bad else 1.0)).backward()
            scaler.unscale_(optimizer)
            expected["weight0"].append(model[0].weight.grad.norm().item() if step not in bad else math.nan)
            scaler.step(optimizer)
            scaler.update()
    return w, expected


def test_output_gradient_norms_are_unscaled_with_the_scale_of_their_own_backward() -> None:
    w, run = _train(5, bad={2})
    results = w.results()
    good = torch.tensor([s for s in range(5) if s != 2])
    for name, path in (("out0", "0"), ("out2", "2")):
        expected = torch.tensor(run[name], dtype=torch.float64)[good]
        assert torch.allclose(results.output_grads[path]["norm"][good], expected, rtol=1e-5)
    weight0 = torch.tensor(run["weight0"], dtype=torch.float64)[good]
    assert torch.allclose(results.param_grads["0.weight"]["norm"][good], weight0, rtol=1e-5)


def test_a_skipped_step_is_its_own_step_with_no_parameter_gradients_or_update() -> None:
    w, _ = _train(4, bad={1})
    results = w.results()
    assert results.steps.tolist() == [0, 1, 2, 3]
    assert results.skipped_steps == [1]
    assert results.activations["0"]["count"].tolist() == [48.0] * 4  # 8 x 6 per step: nothing merged
    assert results.output_grads["0"]["nonfinite"][1] > 0  # what made the scaler skip
    assert torch.isnan(results.param_grads["0.weight"]["norm"][1])
    assert torch.isnan(results.update_ratios["0.weight"][1])
    assert torch.isfinite(results.update_ratios["0.weight"][[0, 2, 3]]).all()
    assert "skipped by the loss scaler (1): steps 1" in results.summary()
    assert results.meta["grad_scaler"] == "unscaled"


def test_skipped_steps_survive_save_load_and_state_dict(tmp_path: Path) -> None:
    w, _ = _train(4, bad={0, 3})
    results = w.results()
    assert results.skipped_steps == [0, 3]  # the last one found at detach, with no forward after it
    assert WatchResults.load(results.save(tmp_path / "r.safetensors")).skipped_steps == [0, 3]
    state = w.state_dict()
    fresh = Watch()
    fresh.load_state_dict(state)  # waits, whole, for the modules of the next attach
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 1))
    fresh.attach(model, torch.optim.SGD(model.parameters(), lr=0.01)).detach()
    assert fresh.results().skipped_steps == [0, 3] and fresh.stepper.state.optimizer_steps == 4


def test_scaler_arguments_are_checked() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="scaler must be a torch.GradScaler or None, got <object"):
        watch(model, scaler=object())  # type: ignore[arg-type]
    w = watch(model, scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(ValueError, match="scaler needs the optimizer"):
        w.attach()
    assert not w.is_attached
