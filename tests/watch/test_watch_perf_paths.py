"""The fast paths of watch(): large outputs described in the hook, small ones copied and batched over steps,
in-place ops after a hook, mixed sizes, late gradients, non-finite gradients, very large outputs described from a
sample; checked against the one oracle (tests/stats_oracle.py) on the same hooked tensors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn

from hookscope.callbacks import HookCallback, LoopDriver
from hookscope.watch import Watch, _buffers, watch
from stats_oracle import auto_exponent, auto_histogram, expected, values_of

LARGE = 1 << 15  # outputs with at least this many values take the large-tensor path


class Capture(HookCallback):
    """CPU copies of every output of the hooked modules, per training batch."""

    def __init__(self, modules: Any) -> None:
        super().__init__(modules=modules, cpu=True)
        self.batches: list[list[list[torch.Tensor]]] = []

    def on_batch_start(self, batch: int) -> None:
        self.batches.append([[] for _ in self.paths])

    def hook(self, m: nn.Module, i: Any, o: Any) -> Any:
        self.batches[-1][self.hooked_modules.index(m)].append(o.float().clone())


class GradCapture(HookCallback):
    """CPU copies of the gradient of every output of the hooked modules, per training batch, from tensor hooks
    (full backward hooks forbid the in-place ops these tests put after modules)."""

    def __init__(self, modules: Any) -> None:
        super().__init__(modules=modules, detach=False, cpu=False)
        self.batches: list[list[list[torch.Tensor]]] = []

    def on_batch_start(self, batch: int) -> None:
        self.batches.append([[] for _ in self.paths])

    def hook(self, m: nn.Module, i: Any, o: Any) -> Any:
        found = self.batches[-1][self.hooked_modules.index(m)]
        if o.requires_grad:
            o.register_hook(lambda grad: found.append(grad.float().clone()))


def oracle(x: torch.Tensor) -> dict[str, float]:
    wanted = expected(values_of(x))
    names = ("mean", "std", "rms", "min", "max", "near_zero", "nonfinite", "count")
    return {name: float(getattr(wanted, name)) for name in names}


def check_activations(results: Any, paths: list[str], capture: Capture, steps: int) -> None:
    for j, path in enumerate(paths):
        for k in range(steps):
            x = torch.cat([t.reshape(-1) for t in capture.batches[k][j]])
            for name, value in oracle(x).items():
                got = float(results.activations[path][name][k])
                assert got == pytest.approx(value, rel=1e-4, abs=1e-6), (path, k, name)


def check_hist(results: Any, paths: list[str], capture: Capture, steps: int) -> None:
    for j, path in enumerate(paths):
        values = [values_of(*capture.batches[k][j]) for k in range(steps)]
        exponent = auto_exponent(np.concatenate(values))
        assert exponent is not None and float(results.hist_edges[path][-1]) == 2.0**exponent
        bins = len(results.hist_edges[path]) - 1
        for k in range(steps):
            assert results.histograms[path][k].tolist() == auto_histogram(values[k], bins, exponent).tolist(), (path, k)


def large_model() -> nn.Sequential:
    # outputs of 64 x 1024 = 65536 values: above the batching threshold; the last layer is small
    return nn.Sequential(
        nn.Linear(16, 1024), nn.Tanh(), nn.Linear(1024, 1024), nn.ReLU(inplace=True), nn.Linear(1024, 3)
    )


def train(
    model: nn.Module, w: Watch, inputs: list[torch.Tensor], paths: list[str]
) -> tuple[Capture, GradCapture, list[Any]]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    forward, backward = Capture(paths), GradCapture(paths)
    params = dict(model.named_parameters())
    seen: list[Any] = []
    with LoopDriver([forward, backward, w], model, opt):
        for x in inputs:
            model(x).pow(2).mean().backward()
            before = {n: p.detach().clone() for n, p in params.items()}
            grads = {n: float(p.grad.norm()) for n, p in params.items()}
            opt.step()
            ratios = {n: float((p.detach() - before[n]).norm() / p.detach().norm()) for n, p in params.items()}
            seen.append((grads, ratios))
            opt.zero_grad()
    return forward, backward, seen


def test_large_outputs_match_the_oracle_also_when_an_in_place_op_follows() -> None:
    torch.manual_seed(0)
    model, paths = large_model(), ["0", "1", "2", "4"]
    w = watch(model, select=paths, exact=True)  # every value of the large outputs described
    inputs = [torch.randn(64, 16) for _ in range(2)]
    forward, backward, seen = train(model, w, inputs, paths)
    results = w.results()
    check_activations(results, paths, forward, steps=2)  # "2" is followed by ReLU(inplace=True)
    check_hist(results, paths, forward, steps=2)
    assert float(results.activations["1"]["saturated"][0]) == pytest.approx(
        float((forward.batches[0][1][0].abs() >= 0.98).double().mean())
    )
    x = torch.cat([forward.batches[k][2][0] for k in range(2)])
    torch.testing.assert_close(results.unit_activity["2"], (x > 0).double().mean(0))
    for j, path in enumerate(paths):
        for k in range(2):
            grad = backward.batches[k][j][0]
            assert float(results.output_grads[path]["norm"][k]) == pytest.approx(float(grad.norm()), rel=1e-4)
            assert float(results.output_grads[path]["nonfinite"][k]) == 0
    for k, (grads, _) in enumerate(seen):
        for name, norm in grads.items():
            assert float(results.param_grads[name]["norm"][k]) == pytest.approx(norm, rel=1e-4)


@pytest.mark.parametrize("exact", [False, True])
def test_very_large_outputs_are_sampled_and_marked_or_exact_on_request(exact: bool) -> None:
    """Outputs above 131072 values: mean, count, min and max exact, the rest within the sampling bounds (std 2 %,
    fractions 0.01), `sampled` = 1; with exact=True every statistic is exact and `sampled` = 0."""
    torch.manual_seed(7)
    model, paths = nn.Sequential(nn.Linear(16, 1024), nn.ReLU()), ["0", "1"]
    capture, w = Capture(paths), Watch(select=paths, exact=exact)
    with LoopDriver([capture, w], model):
        model(torch.randn(256, 16) + 0.5)  # 262144 values per output
    results = w.results()
    for j, path in enumerate(paths):
        want = oracle(capture.batches[0][j][0])
        got = {name: float(results.activations[path][name][0]) for name in (*want, "sampled")}
        assert got["sampled"] == (0.0 if exact else 1.0)
        for name in ("mean", "min", "max", "count", "nonfinite"):
            assert got[name] == pytest.approx(want[name], rel=1e-5, abs=1e-6), (path, name)
        loose = 1e-5 if exact else 0.02
        assert got["std"] == pytest.approx(want["std"], rel=loose), path
        assert abs(got["near_zero"] - want["near_zero"]) <= (1e-9 if exact else 0.01), path
    active = results.unit_activity["1"]
    truth = (capture.batches[0][1][0] > 0).double().mean(0)
    if exact:
        assert (active - truth).abs().max() <= 1e-12
    else:  # about 23 sampled values per unit in one step: each unit's estimate is rough, dead units are exact
        assert (active - truth).abs().mean() <= 0.2  # about 8 sampled values per unit in one step
        assert bool((active[truth == 0] == 0).all())


def test_sampled_unit_activity_converges_over_steps() -> None:
    """Each step samples other positions: over 80 steps (about 640 sampled values per unit) every unit's estimate
    is within 0.1 of the truth."""
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(16, 1024), nn.ReLU())
    with torch.no_grad():
        model[0].bias[:100] = -100.0  # a hundred dead units
    capture, w = Capture(["1"]), Watch(select=["1"], every=1)
    with LoopDriver([capture, w], model):
        for _ in range(80):
            model(torch.randn(256, 16))
    truth = torch.cat([b[0][0] for b in capture.batches]).gt(0).double().mean(0)
    active = w.results().unit_activity["1"]
    assert (active - truth).abs().max() <= 0.1
    assert bool((active[:100] == 0).all())


@pytest.mark.parametrize("exact", [True, False])
def test_update_ratios_of_large_and_small_parameters_match_the_oracle(exact: bool) -> None:
    """Small parameters' changes are read whole; a large one's ("0.weight", 16,384 values, and "2.weight", 1M) is
    read whole with `exact=True`, else its change and its weight are estimated from the same 8,000 or so positions
    read before and after the step: within 4 % of the truth (the estimate's spread on this model's first step,
    over 400 random starts: a standard deviation of 0.5 % for "0.weight" and 1.2 % for "2.weight", 2.7 % at most,
    so 4 % is over 3 standard deviations; positions that differ before and after the step are off by far more)."""
    torch.manual_seed(1)
    model = large_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    w = watch(model, opt, select=["0", "2", "4"], exact=exact)
    inputs = [torch.randn(64, 16) for _ in range(3)]
    _, _, seen = train(model, w, inputs, ["0"])
    results = w.results()
    assert results.steps.tolist() == [0, 1, 2]
    for k, (grads, ratios) in enumerate(seen):
        for name in grads:  # "2.weight" is large (1M values), the biases small
            assert float(results.param_grads[name]["norm"][k]) == pytest.approx(grads[name], rel=1e-4)
            tolerance = 0.04 if name in ("0.weight", "2.weight") and not exact else 1e-3
            assert float(results.update_ratios[name][k]) == pytest.approx(ratios[name], rel=tolerance)


class InPlaceAt(nn.Module):
    """Linear whose output the parent changes in place, but only at forward number `at` (from 0)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.linear, self.at, self.calls = nn.Linear(4, 8), at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if self.calls == self.at:
            y.mul_(100.0)
        self.calls += 1
        return torch.tanh(y)


@pytest.mark.parametrize("at", [0, 2])
def test_small_outputs_changed_in_place_after_the_hook_are_described_as_the_hook_saw_them(at: int) -> None:
    torch.manual_seed(2)
    model, paths = InPlaceAt(at), ["linear"]
    capture, w = Capture(paths), watch(model, select=paths)
    with LoopDriver([capture, w], model):
        for k in range(4):
            model(torch.randn(6, 4))
            if k == 1:
                w.results()  # writes the pending steps in the middle
    results = w.results()
    for k in range(4):
        x = capture.batches[k][0][0]  # the hook's view before the in-place change
        assert float(results.activations["linear"]["mean"][k]) == pytest.approx(float(x.mean()), rel=1e-5)
        assert float(results.activations["linear"]["max"][k]) == pytest.approx(float(x.max()), rel=1e-5)
    assert "changed_in_place" not in results.dropped  # small outputs are copied in the hook: nothing is lost


class Twice(nn.Module):
    """Calls one linear layer on the first two rows (a small output), then on all rows (a large one)."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(8, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(x[:2]).sum() + self.shared(x).sum()


def test_a_module_called_with_small_and_large_inputs_merges_both() -> None:
    torch.manual_seed(3)
    model = Twice()
    capture, w = Capture(["shared"]), Watch(select=["shared"], exact=True)
    with LoopDriver([capture, w], model):
        model(torch.randn(64, 8))  # 2 x 1024 values, then 64 x 1024
    x = torch.cat([t.reshape(-1) for t in capture.batches[0][0]])
    stats = w.results().activations["shared"]
    for name, value in oracle(x).items():
        assert float(stats[name][0]) == pytest.approx(value, rel=1e-4, abs=1e-6), name


class EditGrad(torch.autograd.Function):
    """The identity, whose backward hands on `edit(grad)`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, edit: Any) -> torch.Tensor:
        ctx.edit = edit
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.edit(grad), None


class GradEdit(nn.Module):
    def __init__(self, edit: Any) -> None:
        super().__init__()
        self.edit = edit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return EditGrad.apply(x, self.edit)


def spike(grad: torch.Tensor) -> torch.Tensor:
    """Three inf values."""
    return grad.flatten().index_fill(0, torch.arange(3), math.inf).view_as(grad)


@pytest.mark.parametrize(("rows", "exact"), [(2, False), (64, True), (64, False), (256, False)])
def test_non_finite_gradients_are_counted_and_left_out_of_the_norm(rows: int, exact: bool) -> None:
    """Small (batched), large (described at once) and very large (sampled) gradients with three inf values."""
    model = nn.Sequential(nn.Linear(8, 1024), GradEdit(spike), nn.Linear(1024, 1))
    backward = GradCapture(["0"])
    w = Watch(select=["0"], exact=exact)
    with LoopDriver([backward, w], model):
        model(torch.randn(rows, 8)).sum().backward()
    grads = w.results().output_grads["0"]
    wanted = expected(values_of(*backward.batches[0][0]))
    if exact or rows * 1024 < 1 << 15:  # described exactly: small, or exact=True
        assert float(grads["nonfinite"][0]) == 3
        assert float(grads["norm"][0]) == pytest.approx(wanted.norm, rel=1e-6)
    else:  # from a sample: the count is estimated (at least 1), the norm is that of the finite values
        assert float(grads["nonfinite"][0]) >= 1
        assert float(grads["norm"][0]) == pytest.approx(wanted.norm, rel=0.02)


def huge(grad: torch.Tensor) -> torch.Tensor:
    """Every value finite (about 3e18), their float32 sum of squares not."""
    return grad * 1e20


@pytest.mark.parametrize("exact", [True, False])
def test_a_sampled_gradient_whose_sum_of_squares_overflows_float32_is_not_called_non_finite(exact: bool) -> None:
    """An output gradient of 16384 values or more is read as its float32 sum of squares; when that sum is not
    finite, its min/max say whether a value is: a finite gradient whose norm is beyond float32's range has none,
    its norm estimated from the sample; `exact=True` reads every value."""
    model = nn.Sequential(nn.Linear(8, 1024), GradEdit(huge), nn.Linear(1024, 1))
    backward = GradCapture(["0"])
    w = Watch(select=["0"], exact=exact)
    with LoopDriver([backward, w], model):
        model(torch.randn(64, 8)).sum().backward()
    grads = w.results().output_grads["0"]
    wanted = expected(values_of(*backward.batches[0][0]))
    assert wanted.nonfinite == 0 and wanted.norm > 3.5e38**0.5  # the oracle: all finite, squares overflow float32
    assert float(grads["nonfinite"][0]) == 0
    assert float(grads["norm"][0]) == pytest.approx(wanted.norm, rel=1e-6 if exact else 0.02)


@pytest.mark.parametrize("exact", [True, False])
def test_non_finite_parameter_gradients_are_counted_or_flagged_and_left_out_of_the_norm(exact: bool) -> None:
    """A small parameter's gradient (batched) is counted exactly; a large one's (65,536 values) exactly with
    `exact=True`, else found by its min/max once its float32 sum of squares is not finite, the count (at least 1)
    and the norm of its finite values estimated from the sample."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(1024, 64), nn.ReLU(), nn.Linear(64, 1))
    poison = {"0.weight": [5, 700, 40_000], "0.bias": [7]}
    for name, parameter in model.named_parameters():
        if name in poison:
            where = torch.tensor(poison[name])
            parameter.register_hook(lambda g, where=where: g.flatten().index_fill(0, where, math.nan).view_as(g))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    w = watch(model, opt, every=1, exact=exact)
    with LoopDriver([w], model, opt):
        model(torch.randn(32, 1024)).sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        opt.step()
    results = w.results().param_grads
    for name, grad in grads.items():
        wanted = expected(values_of(grad))
        assert wanted.nonfinite == len(poison.get(name, []))  # the oracle saw the poison
        got = {stat: float(results[name][stat][0]) for stat in ("norm", "nonfinite")}
        if name == "0.weight" and not exact:
            assert got["nonfinite"] >= 1
            assert got["norm"] == pytest.approx(wanted.norm, rel=0.02)
        else:
            assert got["nonfinite"] == wanted.nonfinite, name
            assert got["norm"] == pytest.approx(wanted.norm, rel=1e-6), name


def test_a_gradient_that_arrives_after_its_step_is_still_recorded() -> None:
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(3, 5))
    backward, w = GradCapture(["0"]), watch(model, select=["0"])
    with LoopDriver([backward, w], model):
        first = model(torch.randn(4, 3)).pow(2).sum()
        second = model(torch.randn(4, 3)).sum()  # step 1 begins: step 0 is written
        first.backward()  # step 0's gradient arrives late
        second.backward()
    grads = w.results().output_grads["0"]["norm"]
    assert float(grads[0]) == pytest.approx(float(backward.batches[0][0][0].norm()), rel=1e-5)
    assert float(grads[1]) == pytest.approx(float(backward.batches[1][0][0].norm()), rel=1e-5)


@pytest.mark.parametrize("buffer_steps", [5, 64])
def test_small_tensors_of_many_steps_written_together_match_the_oracle_step_by_step(buffer_steps: int) -> None:
    """70 steps: several batches of pending steps (32 at most), a ring of 5 rows that wraps inside a batch, a
    read in the middle, a batch size that changes (new layouts) and one step with a large output."""
    torch.manual_seed(5)
    model, paths = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)), ["0", "1", "2"]
    w = watch(model, select=paths, buffer_steps=buffer_steps, exact=True, every=1)
    sizes = [4 + k % 3 for k in range(70)]
    sizes[40] = 3000  # 36000 values out of "0" and "1": the large path, in the middle of a pending batch
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    forward, backward = Capture(paths), GradCapture(paths)
    grads: list[float] = []
    ratios: list[float] = []
    with LoopDriver([forward, backward, w], model, opt):
        for k, size in enumerate(sizes):
            model(torch.randn(size, 6)).pow(2).mean().backward()
            grads.append(float(model[0].weight.grad.norm()))
            before = model[2].bias.detach().clone()
            opt.step()
            ratios.append(float((model[2].bias.detach() - before).norm() / model[2].bias.detach().norm()))
            opt.zero_grad()
            if k == 20:
                assert w.results().num_steps == 21  # step 20's optimizer step is done: read mid-run, it is included
    results = w.results()
    assert results.steps.tolist() == list(range(70))
    check_activations(results, paths, forward, 70)
    check_hist(results, paths, forward, 70)
    for j, path in enumerate(paths):
        norms = torch.tensor([backward.batches[k][j][0].norm() for k in range(70)], dtype=torch.float64)
        assert torch.allclose(results.output_grads[path]["norm"], norms, rtol=1e-4), path
    assert torch.allclose(results.param_grads["0.weight"]["norm"], torch.tensor(grads, dtype=torch.float64), rtol=1e-4)
    assert torch.allclose(results.update_ratios["2.bias"], torch.tensor(ratios, dtype=torch.float64), rtol=1e-3)


def test_a_gradient_that_arrives_after_its_step_was_written_is_added_to_its_row_or_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_buffers, "PENDING_STEPS", 1)  # every step is written when it closes
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(3, 5))
    backward, w = GradCapture(["0"]), watch(model, select=["0"])
    with LoopDriver([backward, w], model):
        first = model(torch.randn(4, 3)).pow(2).sum()
        second = model(torch.randn(4, 3)).sum()  # step 1 begins: step 0 is closed and written
        first.backward()  # step 0's gradient arrives after its row was written: added to the row
        model(torch.randn(4, 3))  # step 2 begins
        w.results()  # steps 0 and 1 move to the host
        second.backward()  # too late for step 1's row: counted
    results = w.results()
    assert float(results.output_grads["0"]["norm"][0]) == pytest.approx(
        float(backward.batches[0][0][0].norm()), rel=1e-5
    )
    assert math.isnan(float(results.output_grads["0"]["norm"][1]))
    assert results.dropped["late_gradient"] == 1


def test_large_four_dimensional_outputs_have_per_channel_unit_activity() -> None:
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU())
    capture, w = Capture(["0", "1"]), watch(model, select=["0", "1"], exact=True)
    with LoopDriver([capture, w], model):
        model(torch.randn(8, 3, 16, 16))  # 8 x 16 x 16 x 16 = 32768 values
    x = capture.batches[0][1][0]
    torch.testing.assert_close(w.results().unit_activity["1"], (x > 0).double().mean((0, 2, 3)))
    check_activations(w.results(), ["0", "1"], capture, steps=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_no_host_device_sync_between_flushes_on_cuda() -> None:
    model = large_model().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 16, device="cuda")
    with watch(model, opt, buffer_steps=16) as w:
        for _ in range(3):  # layouts and buffers are built in the first steps
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(10):
                loss = model(x).pow(2).mean()
                w.log_loss(loss)
                loss.backward()
                opt.step()
                opt.zero_grad()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert w.results().num_steps == 13


def test_learning_rates_follow_every_change_between_steps_with_the_same_ones() -> None:
    """The learning rate and epsilon recorded at each step are the param group's after its optimizer step, through
    steps that change nothing (read once), a rate set by hand, a group added with a rate of its own, and a tensor
    rate changed in place (read every step)."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    first, second = list(model[0].parameters()), list(model[2].parameters())
    optimizer = torch.optim.Adam(first, lr=0.1, eps=1e-6)
    x = torch.randn(8, 4)
    wanted: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in model.named_parameters()}
    with watch(model, optimizer, every=1) as w:
        for step in range(8):
            if step == 3:
                optimizer.param_groups[0]["lr"] = 0.05
            if step == 5:
                optimizer.add_param_group({"params": second, "lr": torch.tensor(0.2), "eps": 1e-4})
            if step == 7:
                optimizer.param_groups[1]["lr"].fill_(0.3)
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            for name, parameter in model.named_parameters():
                group = next((g for g in optimizer.param_groups if any(p is parameter for p in g["params"])), None)
                wanted[name].append((math.nan, math.nan) if group is None else (float(group["lr"]), group["eps"]))
    for name, stats in w.results().optimizer.items():
        got = torch.stack((stats["lr"], stats["eps"]), dim=1)
        torch.testing.assert_close(got, torch.tensor(wanted[name], dtype=torch.float64), equal_nan=True, msg=name)
