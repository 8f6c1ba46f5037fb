"""End to end: plant each fault in a small model, train a few steps under `watch()`, diagnose what it collected."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn as nn
from doctor_oracle import mlp, regression_batches

from hookscope.doctor import DiagnosisWarning, Finding, diagnose
from hookscope.results import WatchResults
from hookscope.watch import watch


class LogScale(nn.Module):
    """A custom layer with a parameter (so `watch()` selects it): x * scale, but log(-1) = NaN on call `at`."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * self.scale * (torch.log(self.scale * 0 - 1) if self.calls - 1 == self.at else 1)


def trained(
    model: nn.Module,
    steps: int,
    lr: float = 1e-3,
    data: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.mse_loss,
    **options: object,
) -> WatchResults:
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    data = data or regression_batches()
    with watch(model, optimizer, **{"every": 1, **options}) as w:  # type: ignore[arg-type]
        for _ in range(steps):
            x, y = next(data)
            loss = loss_fn(model(x), y)
            w.log_loss(loss)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return w.results()


def where(findings: list[Finding], check: str) -> list[tuple[str | None, int | None]]:
    return [(f.path, f.step) for f in findings if f.check == check]


def test_a_healthy_model_raises_no_warning_and_the_live_doctor_stays_quiet() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosisWarning)
        results = trained(mlp(), steps=40, doctor=True, doctor_every=10)
    assert float(results.losses[-5:].mean()) < 0.5 * float(results.losses[:5].mean())
    assert [f for f in diagnose(results) if f.severity != "info"] == []


def image_batches(seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """8x8 noise images whose class (0/1) brightens the top half: learnable by a small CNN."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        y = torch.randint(0, 2, (32,), generator=generator)
        x = torch.randn(32, 1, 8, 8, generator=generator)
        x[:, :, :4] += y[:, None, None, None]
        yield x, y


def sign_batches(seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Binary targets: is the first input positive."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(64, 8, generator=generator)
        yield x, (x[:, :1] > 0).float()


@pytest.mark.parametrize("seed", [1, 2])
def test_other_healthy_models_raise_no_warning(seed: int) -> None:
    torch.manual_seed(seed)
    cnn = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 2),
    )  # fmt: skip
    classifier = nn.Sequential(mlp(activation=nn.GELU), nn.Sigmoid())
    runs = [
        trained(cnn, 60, lr=3e-3, data=image_batches(seed), loss_fn=nn.functional.cross_entropy),
        trained(classifier, 80, lr=1e-2, data=sign_batches(seed), loss_fn=nn.functional.binary_cross_entropy),
    ]
    for results in runs:
        assert float(results.losses[-5:].mean()) < 0.7 * float(results.losses[:5].mean())
        assert [str(f) for f in diagnose(results) if f.severity != "info"] == []


@pytest.mark.parametrize("every", [1, 4])
def test_a_nan_from_one_layer_is_blamed_on_it_even_on_a_step_every_skips(every: int) -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), LogScale(3), nn.ReLU(), nn.Linear(16, 1))
    findings = diagnose(trained(model, steps=6, every=every))
    assert (findings[0].check, findings[0].path, findings[0].step) == ("nonfinite_forward", "3", 3)


def test_a_learning_rate_100x_too_high_is_warned_about_once_while_training() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = trained(mlp(), steps=12, lr=1e-1, doctor=True, doctor_every=2)
    said = [str(w.message) for w in caught if w.category is DiagnosisWarning]
    assert len([s for s in said if "[lr_too_high]" in s]) == 1, said
    assert where(diagnose(results), "lr_too_high") == [(None, 0)]


def test_a_bias_that_kills_a_relu_layer() -> None:
    model = mlp()
    nn.init.constant_(model[2].bias, -10.0)
    (found,) = [f for f in diagnose(trained(model, steps=8)) if f.check == "dead_units"]
    assert (found.path, found.evidence["dead"], found.evidence["units"]) == ("3", 32, 32)


def test_constant_initialization() -> None:
    model = mlp(width=16)
    for layer in model:
        if isinstance(layer, nn.Linear):
            nn.init.constant_(layer.weight, 0.05)
            nn.init.zeros_(layer.bias)
    assert sorted(p for p, _ in where(diagnose(trained(model, steps=8)), "symmetry")) == ["0", "2"]


def test_tanh_saturated_by_huge_weights() -> None:
    model = mlp(activation=nn.Tanh)
    nn.init.normal_(model[2].weight, std=5.0)
    assert where(diagnose(trained(model, steps=6)), "saturation") == [("3", 0)]


def test_a_deep_stack_with_tiny_init() -> None:
    model = mlp(width=32, depth=8)
    for layer in model:
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.zeros_(layer.bias)
    findings = diagnose(trained(model, steps=4))
    (init,) = [f for f in findings if f.check == "bad_init"]
    assert init.evidence["direction"] == "collapse" and init.path in {str(i) for i in range(1, 16)}
    assert where(findings, "vanishing_gradients")
