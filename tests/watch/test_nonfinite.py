"""Where values first became non-finite: the producing module and the step, forward and backward, no host sync."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn

from hookscope.watch import watch


class NaNAt(nn.Module):
    """Identity, except that at forward number `at` (from 0) its output is NaN in one place."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls - 1 == self.at:
            x = x.clone()
            x[0, 0] = float("nan")
        return x


class _InfGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.full_like(grad, float("inf"))


class InfGradAt(nn.Module):
    """Identity whose backward returns infinite gradients at forward number `at`."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return _InfGrad.apply(x) if self.calls - 1 == self.at else x


def model_with(fault: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), fault, nn.ReLU(), nn.Linear(4, 1))


def train(model: nn.Module, steps: int, **options: Any) -> dict[str, Any]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, select=lambda path, m: path != "", **options) as w:
        for _ in range(steps):
            model(torch.randn(8, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
    return w.results().first_nonfinite


@pytest.mark.parametrize("every", [1, 4])
def test_the_first_producer_of_a_nan_is_named_not_the_next_layer(every: int) -> None:
    first = train(model_with(NaNAt(at=2)), steps=6, every=every)
    # without an optimizer passed to watch, a step is a training forward: the NaN appears at step 2
    assert first["forward"] == {"path": "3", "step": 2}


@pytest.mark.parametrize("every", [1, 4])
def test_the_first_non_finite_output_gradient_is_named_in_backward_order(every: int) -> None:
    first = train(model_with(InfGradAt(at=1)), steps=3, every=every)
    # the faulty module's own output gradient is finite; it sends inf to the module before it
    assert first["backward"] == {"path": "2", "step": 1}
    assert first["forward"] == {"path": "0", "step": 2}  # the infinite update reached the weights


def test_nan_input_is_blamed_on_the_first_module_that_outputs_it() -> None:
    model = model_with(nn.Identity())
    with watch(model, select=lambda path, m: path != "") as w:
        model(torch.randn(8, 3))
        model(torch.full((8, 3), float("nan")))
    assert w.results().first_nonfinite["forward"] == {"path": "0", "step": 1}


def test_healthy_training_reports_nothing() -> None:
    assert train(model_with(nn.Identity()), steps=3) == {"forward": None, "backward": None}


def test_nonfinite_counts_are_exact_and_do_not_poison_other_layers() -> None:
    model = model_with(NaNAt(at=0))
    with watch(model, select=lambda path, m: path != "") as w:
        model(torch.randn(8, 3))
    stats = w.results().activations
    assert float(stats["3"]["nonfinite"][0]) == 1
    assert float(stats["2"]["nonfinite"][0]) == 0 and torch.isfinite(stats["2"]["mean"]).all()
    assert [float(stats[p]["nonfinite"][0]) for p in ("4", "5")] == [1, 1]  # only the NaN's row carries it on


def test_unchecked_skipped_steps_cost_nothing_and_find_nothing() -> None:
    first = train(model_with(NaNAt(at=2)), steps=3, every=4, check_nonfinite=False)
    assert first["forward"] is None


def test_no_host_sync_during_watched_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    model = model_with(NaNAt(at=3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = watch(model, opt, every=2, select=lambda path, m: path != "")
    with w:
        model(torch.randn(8, 3)).sum().backward()
        opt.step()
        for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"):
            monkeypatch.setattr(torch.Tensor, name, _forbidden(name))
        for _ in range(6):
            loss = model(torch.randn(8, 3)).sum()
            w.log_loss(loss)
            loss.backward()
            opt.step()
            opt.zero_grad()
        monkeypatch.undo()
    results = w.results()
    assert results.steps.tolist() == [0, 2, 4, 6]
    assert results.first_nonfinite["forward"] == {"path": "3", "step": 3}


def _forbidden(name: str) -> Any:
    def raise_(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"host sync through Tensor.{name} during a watched step")

    return raise_


def test_an_exploding_gradient_of_finite_values_is_not_called_non_finite() -> None:
    """Gradients of norm ~1e24 (every value finite, float32's sum of squares overflows): large ones (the sampled
    path) have no non-finite value, their norms match float64, and no module is named as the first non-finite."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay: the oracle reads them after
    x = torch.randn(128, 256)
    with watch(model, opt, every=1) as w:
        for _ in range(2):
            opt.zero_grad()
            (model(x).sum() * 1e22).backward()
            opt.step()
    results = w.results()
    assert results.first_nonfinite == {"forward": None, "backward": None}
    with torch.no_grad():
        grad_of_hidden = (torch.full((128, 10), 1e22, dtype=torch.float64) @ model[1].weight.double()).norm()
        wanted = {"0.weight": model[0].weight.grad.double().norm(), "0": grad_of_hidden}
        assert float(model[0].weight.grad.double().square().sum().float()) == float("inf")  # the sum overflows
    for found, name in ((results.param_grads, "0.weight"), (results.output_grads, "0")):
        assert found[name]["nonfinite"].tolist() == [0.0, 0.0]
        assert found[name]["norm"].tolist() == pytest.approx([float(wanted[name])] * 2, rel=0.05)
    assert all(float(stats["nonfinite"].sum()) == 0 for stats in results.param_grads.values())


class SharedActivation(nn.Module):
    """`act` called twice per forward, `mid` between its two calls (torchvision's BasicBlock and its `relu`)."""

    def __init__(self, width: int, act: nn.Module, mid: nn.Module) -> None:
        super().__init__()
        self.inp, self.act, self.mid, self.out = nn.Linear(8, width), act, mid, nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.mid(self.act(self.inp(x)))))


@pytest.mark.parametrize(
    ("at", "forwards", "every"),
    [(0, 1, 1), (2, 1, 1), (5, 2, 1), (2, 1, 4), (5, 2, 4)],  # the learned step, a later one, 2 forwards a step;
)  # every=4: step 2 is only checked (one min/max per call), not recorded
@pytest.mark.parametrize("batch", [4, 64])  # small outputs (copied), large ones (read as sums and a sample)
@pytest.mark.parametrize("maker", ["mid", "act"])
def test_a_nan_is_named_at_its_maker_when_a_shared_module_runs_before_and_after_it(
    at: int, forwards: int, every: int, batch: int, maker: str
) -> None:
    """A NaN made between the two calls of a shared activation is named at its maker, not at the activation whose
    first call ran before it; one made by the activation's first call is named at the activation. `at` counts
    forwards: with two a step (gradient accumulation), forward 5 is the second of step 2."""
    torch.manual_seed(0)
    act, mid = (nn.ReLU(), NaNAt(at)) if maker == "mid" else (NaNAt(2 * at), nn.Identity())  # act: 2 calls a forward
    model = SharedActivation(512, act, mid)
    first = train_on(model, steps=at // forwards + 2, batch=batch, forwards=forwards, every=every)
    assert first["forward"] == {"path": maker, "step": at // forwards}


def train_on(model: nn.Module, steps: int, batch: int, forwards: int, every: int = 1) -> dict[str, Any]:
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with watch(model, opt, every=every, select=lambda path, m: path != "") as w:
        for _ in range(steps):
            opt.zero_grad()
            for _ in range(forwards):
                model(torch.randn(batch, 8)).sum().backward()
            opt.step()
    return w.results().first_nonfinite
