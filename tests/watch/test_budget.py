"""The overhead budget: which steps `watch()` measures, so that its own cost stays within `budget` of the run.

The token bucket is checked against a fake clock (exact, no timing on this machine), then a real run on a model
where measuring every step costs several times the step: the cost hookscope records for itself stays within the
budget, and the first and last steps of a long run are measured.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

from hookscope.callbacks import _budget
from hookscope.callbacks._budget import WARMUP_STEPS, Budget
from hookscope.watch import watch
from hookscope.watch._watch import Watch
from stretches import record_stretches


class FakeClock:
    """`time.perf_counter` of `hookscope.callbacks._budget`, advanced by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def simulate(budget: Budget, clock: FakeClock, steps: int, step_time: float, cost: float) -> list[int]:
    """Run `steps` steps of `step_time` seconds; a measured one costs hookscope `cost` more. Return the measured."""
    measured = []
    for step in range(steps):
        if budget.begin(step):
            measured.append(step)
            budget.add_own(cost)
            clock.now += cost
        clock.now += step_time
    budget.settle()  # the last step ends
    return measured


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(_budget.time, "perf_counter", fake)
    return fake


def test_an_expensive_measurement_is_spaced_to_keep_the_budget(clock: FakeClock) -> None:
    budget = Budget(0.03, every=1)
    measured = simulate(budget, clock, 2000, step_time=1e-3, cost=5e-3)  # every step measured would be 6x
    assert measured[:WARMUP_STEPS] == list(range(WARMUP_STEPS)) and WARMUP_STEPS not in measured  # then a probe
    later = [s for s in measured if s >= WARMUP_STEPS]
    gaps = {b - a for a, b in itertools.pairwise(later)}
    # a measured step costs 5 ms; 3 % of each 1 ms step pays for it after about 5 ms / 0.03 ms = 167 steps
    expected = math.ceil(5e-3 / (0.03 * 1e-3))
    assert gaps <= {expected - 1, expected} and len(later) > 5
    bare = (2000 - WARMUP_STEPS) * 1e-3
    assert len(later) * 5e-3 / bare <= 0.03 + 5e-3 / bare  # within the budget, give or take the step that ends it
    summary = budget.summary()
    assert summary["steps"] == 2000 and summary["budget"] == 0.03
    assert summary["step_cost"] == pytest.approx(5.0)
    assert summary["cost"] == pytest.approx(len(measured) * 5e-3 / 2000e-3)  # hookscope's time over the bare time
    assert summary["seconds"] == pytest.approx({"own": len(measured) * 5e-3, "total": 2000e-3 + len(measured) * 5e-3})


def test_a_cheap_measurement_is_made_every_step(clock: FakeClock) -> None:
    budget = Budget(0.03, every=1)
    # 1 % < 3 %: all but the first step after the warm-up, left alone to learn what a step takes without it
    assert simulate(budget, clock, 300, step_time=1e-3, cost=1e-5) == [s for s in range(300) if s != WARMUP_STEPS]


def test_every_measures_exactly_every_nth_step_whatever_it_costs(clock: FakeClock) -> None:
    budget = Budget(None, every=7)
    assert simulate(budget, clock, 50, step_time=1e-3, cost=1.0) == list(range(0, 50, 7))
    assert budget.summary()["every"] == 7


def test_a_run_of_10000_steps_measures_its_first_and_last_steps(clock: FakeClock) -> None:
    measured = simulate(Budget(0.03, every=1, max_steps=10_000), clock, 10_000, step_time=1e-3, cost=5e-3)
    assert measured[0] == 0 and measured[-1] == 9_999 and len(measured) < 100


def test_a_step_asked_again_gets_the_same_answer(clock: FakeClock) -> None:
    budget = Budget(0.03, every=1)
    simulate(budget, clock, 40, step_time=1e-3, cost=5e-3)
    first = budget.begin(40)
    clock.now += 1.0  # much later: the same step (gradient accumulation) is not decided again
    assert budget.begin(40) is first and budget.steps == 41


@pytest.mark.parametrize(("budget", "every", "error"), [(0.0, None, "budget must be"), (1.5, None, "budget must be")])
def test_bad_budgets_are_refused(budget: float, every: int | None, error: str) -> None:
    with pytest.raises(ValueError, match=rf"{error} a fraction of the step time in \(0, 1\), such as 0.03"):
        watch(nn.Linear(2, 2), budget=budget, every=every)


def many_small_layers() -> nn.Sequential:
    """A model whose step is little more than Python per module: measuring it every step costs several times it."""
    layers: list[nn.Module] = []
    for _ in range(24):
        layers += [nn.Linear(4, 4), nn.Tanh()]
    return nn.Sequential(*layers)


@pytest.mark.slow  # about 3 s on the CI machine
def test_the_budget_is_kept_on_a_model_where_every_step_would_cost_several_times_the_step() -> None:
    torch.manual_seed(0)
    model = many_small_layers()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, steps = torch.randn(2, 4), 3000
    with watch(model, optimizer, max_steps=steps) as w:
        for _ in range(steps):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    results = w.results()
    measured = results.meta["measured"]
    assert measured["steps"] == steps and measured["budget"] == 0.03
    # hookscope's own record: every step measured would cost more than twice the step (5 to 11 times it on a
    # quiet 2-core machine; the bound is loose because the machine running the suite may be busy)
    assert measured["step_cost"] > 1.0
    # the cost it records for itself: after the warm-up (measured whatever it costs), what the measured steps took
    # stays within the budget of the run's time, give or take two steps' worth (the step that overdraws the
    # budget, a flush of many steps' rows say, and the last step, measured because max_steps names it)
    after = measured["after_warmup"]
    total_bare = w.stepper.budget.total - w.stepper.budget.own
    assert after["seconds"] <= 0.03 * total_bare + 2 * after["largest"]
    kept = results.steps.tolist()
    assert kept[0] == 0 and kept[-1] == steps - 1 and len(kept) < steps / 5
    assert kept[:WARMUP_STEPS] == list(range(WARMUP_STEPS))
    assert results.meta["recorded_steps"] == measured["recorded"]
    assert bool(torch.isfinite(results.activations["0"]["mean"]).all())


def test_steps_not_measured_are_counted_and_record_nothing() -> None:
    model = nn.Sequential(nn.Linear(3, 3))
    with watch(model, every=3) as w:
        for _ in range(7):
            model(torch.randn(2, 3)).sum().backward()
    results = w.results()
    assert results.steps.tolist() == [0, 3, 6]
    assert results.meta["measured"]["every"] == 3 and results.meta["measured"]["recorded"] == 3


def test_the_results_and_the_report_say_in_words_what_was_measured(tmp_path: Path) -> None:
    from hookscope.report import write_report

    model = nn.Sequential(nn.Linear(3, 3))
    with watch(model, every=2) as w:
        for _ in range(5):
            model(torch.randn(2, 3)).sum().backward()
    results = w.results()
    words = results.measured_text()
    assert words.startswith("Measured 1 step in 2 (every=2): 3 of 5 steps; hookscope took ")
    page = write_report(tmp_path / "report", results)
    assert "Measured 1 step in 2 (every=2): 3 of 5 steps" in Path(page).read_text(encoding="utf-8")


def test_a_pause_between_steps_earns_no_more_than_two_typical_steps(clock: FakeClock) -> None:
    budget, measured = Budget(0.03, every=1), []
    for step in range(200):
        if budget.begin(step):
            measured.append(step)
            budget.add_own(5e-3)
            clock.now += 5e-3
        clock.now += 1e-3
        if step == 100:
            clock.now += 10.0  # an eval loop between two training steps: not the step's time
    assert 17 in measured and not any(18 <= s <= 110 for s in measured)


# ---- steps not measured leave the model alone ----------------------------------------------------------------


def schedule(monkeypatch: pytest.MonkeyPatch, measured: set[int]) -> None:
    """Make the budget measure exactly `measured` (its decisions, not its clock, are what these tests are about)."""
    every = Budget._rule  # `every=N` keeps its own rule

    def rule(self: Budget, step: int, credit: float) -> bool:
        return step in measured if self.budget is not None else every(self, step, credit)

    monkeypatch.setattr(Budget, "_rule", rule)


def ours_on(module: nn.Module) -> int:
    """How many of hookscope's hooks torch would call on `module` now (read from torch's own tables)."""
    from hookscope._torch import module_hooks
    from hookscope.hooks._calls import CalledHook

    return sum(isinstance(hook, CalledHook) for table in module_hooks(module).values() for hook in table.values())


@pytest.mark.parametrize("with_optimizer", [True, False])
def test_a_step_not_measured_runs_without_hookscope_hooks_and_the_next_measured_one_records_it_all(
    monkeypatch: pytest.MonkeyPatch, with_optimizer: bool
) -> None:
    measured = {0, 1, 2, 7, 8, 15}
    schedule(monkeypatch, measured)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1) if with_optimizer else None
    seen: list[tuple[int, float]] = []  # (hookscope hooks on model[1] during the forward, model[0]'s output mean)
    model[0].register_forward_hook(lambda m, a, out: seen.append((ours_on(model[1]), out.mean().item())))
    with watch(model, optimizer) as w:
        for _ in range(16):
            if optimizer is not None:
                optimizer.zero_grad()
            model(torch.randn(8, 4)).square().mean().backward()
            if optimizer is not None:
                optimizer.step()
    results = w.results()
    assert results.steps.tolist() == sorted(measured)
    assert [step for step, (hooks, _) in enumerate(seen) if hooks] == sorted(measured)
    oracle = torch.tensor([mean for step, (_, mean) in enumerate(seen) if step in measured], dtype=torch.float64)
    torch.testing.assert_close(results.activations["0"]["mean"], oracle, rtol=1e-5, atol=1e-7)
    assert bool(torch.isfinite(results.param_grads["0.weight"]["norm"]).all())
    if optimizer is not None:  # the step after one left alone has its update ratios, as any measured step
        assert bool(torch.isfinite(results.update_ratios["0.weight"]).all())
    assert ours_on(model[1]) == 0  # detached: removed, paused or not


def run_logging_losses(
    monkeypatch: pytest.MonkeyPatch, order: str, steps: int, first_logged: int = 0
) -> tuple[Any, list[float], list[tuple[int, int]], list[int]]:
    """Train a linear layer for `steps` steps under a watch, logging each step's loss from step `first_logged` on,
    `order` ("after" or "before") the optimizer step; return the watch, the losses, the watch's hooks on the model
    and on the layer after each step, and the steps whose optimizer step start the watch was told of."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses: list[float] = []
    hooks: list[tuple[int, int]] = []
    starts: list[int] = []
    original = Watch.before_optimizer_step
    monkeypatch.setattr(Watch, "before_optimizer_step", lambda self, o: (starts.append(len(hooks)), original(self, o)))
    with watch(model, optimizer) as w:
        for step in range(steps):
            optimizer.zero_grad()
            loss = model(torch.randn(2, 4)).square().mean()
            loss.backward()
            if order == "before" and step >= first_logged:
                w.log_loss(loss)
            optimizer.step()
            if order == "after" and step >= first_logged:
                w.log_loss(loss)
            losses.append(loss.item())
            hooks.append((ours_on(model), ours_on(model[0])))
    return w, losses, hooks, starts


@pytest.mark.parametrize("order", ["after", "before"])
def test_while_steps_are_left_alone_no_hook_of_the_watch_is_on_the_model(
    monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    schedule(monkeypatch, {0, 3})
    w, losses, hooks, starts = run_logging_losses(monkeypatch, order, 5)
    # After each optimizer step the next step is decided. A measured one: the four root hooks and the layer's. One
    # left alone: nothing of the watch's on the model once the losses logged between two optimizer steps were seen
    # whole (from step 0's optimizer step to step 1's) and all on one side of the optimizer step; until then, the
    # loop driver's forward pre-hook, which opens the steps.
    assert hooks == [(1, 0), (0, 0), (4, 1), (0, 0), (0, 0)]
    assert starts == [0, 3]  # the optimizer's step pre-hook is paused on the steps left alone too
    results = w.results()
    assert results.steps.tolist() == [0, 3] and results.meta["measured"]["steps"] == 5
    assert results.losses is not None
    torch.testing.assert_close(results.losses, torch.tensor([losses[0], losses[3]], dtype=torch.float64))
    assert results.dropped["sampling_loss"] == 3
    assert results.logged_steps is not None and results.logged_losses is not None
    assert results.logged_steps.tolist() == [0, 1, 2, 3, 4]  # every step's loss, in its step
    torch.testing.assert_close(results.logged_losses, torch.tensor(losses, dtype=torch.float64))


@pytest.mark.parametrize("order", ["after", "before"])
def test_losses_first_logged_while_steps_are_left_alone_are_placed_once_their_order_is_known(
    monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    schedule(monkeypatch, {0, 7})
    w, losses, hooks, _ = run_logging_losses(monkeypatch, order, 9, first_logged=3)
    # no loss at first: the model is left alone from the second step left alone on; the first loss, logged while
    # nothing follows the batches, waits; the batches are followed again from the next optimizer step, until the
    # next loss says where the loop logs them
    assert hooks[:3] == [(1, 0), (0, 0), (0, 0)] and hooks[6] == (4, 1)
    results = w.results()
    assert results.logged_steps is not None and results.logged_losses is not None
    assert results.logged_steps.tolist() == list(range(3, 9))
    torch.testing.assert_close(results.logged_losses, torch.tensor(losses[3:], dtype=torch.float64))
    assert results.losses is not None
    torch.testing.assert_close(results.losses[1:], torch.tensor([losses[7]], dtype=torch.float64))


def test_a_loop_logging_losses_on_both_sides_of_the_optimizer_step_keeps_its_batches_followed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    schedule(monkeypatch, {0, 4})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    logged: list[tuple[int, float]] = []
    with watch(model, optimizer) as w:
        for step in range(6):
            for micro in range(2):  # gradient accumulation: the first micro-batch's loss before the optimizer step
                loss = model(torch.randn(2, 4)).square().mean()
                loss.backward()
                if micro == 1:
                    optimizer.step()
                    optimizer.zero_grad()
                w.log_loss(loss)
                logged.append((step, loss.item()))
            assert ours_on(model) >= 1  # never left without the driver's forward pre-hook: the order is mixed
    results = w.results()
    assert results.logged_steps is not None and results.logged_losses is not None
    assert results.logged_steps.tolist() == list(range(6))
    oracle = [sum(v for s, v in logged if s == step) / 2 for step in range(6)]
    torch.testing.assert_close(results.logged_losses, torch.tensor(oracle, dtype=torch.float64))


def test_attention_and_the_residual_stream_are_measured_after_steps_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from hookscope.demo import TinyGPT

    measured = {0, 5, 9}
    schedule(monkeypatch, measured)
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (4, 17))
    with watch(model, optimizer) as w:
        for _ in range(10):
            optimizer.zero_grad()
            logits = model(ids[:, :-1])
            nn.functional.cross_entropy(logits.reshape(-1, 64), ids[:, 1:].reshape(-1)).backward()
            optimizer.step()
    results = w.results()
    assert results.steps.tolist() == [0, 5, 9]
    assert set(results.attention) == {"blocks.0.attn", "blocks.1.attn"}
    for series in results.attention.values():
        assert bool(torch.isfinite(series["max_logit"]).all()) and bool(torch.isfinite(series["entropy"]).all())
    assert bool(torch.isfinite(results.residual["blocks.1"]["max"]).all())


def run_steps(budget: Budget, clock: FakeClock, steps: int, step_time: float, cost: float, stretch: bool) -> list[int]:
    """Steps of `step_time` seconds ended at their optimizer step (`end`), the next decided there; a measured one
    costs hookscope `cost` more. With `stretch`, the steps left alone after one left alone are followed as a
    stretch: counted only (`Budget.stretch`, `stretch_ended`). Return the measured steps."""
    measured: list[int] = []
    step, alone = 0, False
    chosen = budget.decide(0)
    while step < steps:
        if stretch and alone and not chosen:
            count = min(budget.stretch(step), steps - step)
            clock.now += count * step_time
            budget.stretch_ended(step, count)
            step += count
        else:
            assert budget.begin(step) is chosen
            if chosen:
                measured.append(step)
                budget.add_own(cost)
                clock.now += cost
            clock.now += step_time
            budget.end()
            step += 1
        alone = not chosen
        chosen = budget.decide(step)
    budget.settle()
    return measured


@pytest.mark.parametrize(("budget", "every"), [(2**-5, 1), (None, 50)])
def test_a_stretch_of_steps_left_alone_is_counted_as_each_step_would_be(
    monkeypatch: pytest.MonkeyPatch, budget: float | None, every: int
) -> None:
    results = []
    for stretch in (False, True):
        clock = FakeClock()
        monkeypatch.setattr(_budget.time, "perf_counter", clock)
        counted = Budget(budget, every=every)
        # dyadic times and budget: sums are exact, and a measured step's debt is 160.5 steps' earnings (no tie)
        measured = run_steps(counted, clock, 2000, step_time=2**-10, cost=5 * 2**-10 + 2**-16, stretch=stretch)
        results.append((measured, counted.summary(), counted.steps))
    (alone, summary, steps), (stretched, stretched_summary, stretched_steps) = results
    assert stretched == alone and len(alone) > 20  # the same steps measured (about one in 160 after the warm-up)
    assert stretched_steps == steps == 2000
    assert stretched_summary["cost"] == pytest.approx(summary["cost"], rel=1e-9)
    assert stretched_summary["step_cost"] == pytest.approx(summary["step_cost"], rel=1e-9)


def test_a_stretch_reaches_the_next_measured_step_and_no_further(clock: FakeClock) -> None:
    budget = Budget(None, every=10)
    assert [budget.stretch(first) for first in (1, 11, 21, 22)] == [1, 1, 1, 1]  # no typical time yet: one
    budget.begin(0)
    clock.now += 1e-3
    budget.end()
    budget.begin(1)
    clock.now += 1e-3
    budget.end()  # a step left alone: its time is the typical one now
    assert [budget.stretch(first) for first in (1, 11, 21, 22)] == [9, 9, 9, 8]  # up to steps 10, 20, 30
    assert Budget(0.03, every=1).stretch(WARMUP_STEPS + 1) == 1


def test_a_decided_step_keeps_its_decision_when_it_begins(clock: FakeClock) -> None:
    budget = Budget(0.03, every=1)
    simulate(budget, clock, WARMUP_STEPS + 1, step_time=1e-3, cost=5e-3)  # the last one overdraws the budget
    budget.begin(WARMUP_STEPS + 1)
    budget.add_own(5e-3)
    clock.now += 1e-3
    assert budget.decide(WARMUP_STEPS + 2) is False  # the open step's earning so far does not pay for one
    assert budget.begin(WARMUP_STEPS + 2) is False


def test_what_a_measured_step_takes_beyond_a_step_left_alone_is_spent_even_when_not_timed(clock: FakeClock) -> None:
    budget, measured = Budget(0.03, every=1), []
    for step in range(400):
        if budget.begin(step):
            measured.append(step)
            clock.now += 4e-3  # hooks traced into a compiled graph: the step is longer, nothing is timed
        clock.now += 1e-3
    budget.settle()
    later = [s for s in measured if s > WARMUP_STEPS]
    # 4 ms beyond a 1 ms step, paid by 3 % of 1 ms a step: one measured step in about 133
    assert later and all(b - a >= 120 for a, b in itertools.pairwise(later))
    assert budget.summary()["after_warmup"]["seconds"] == pytest.approx(4e-3 * len(later))


def test_steps_ended_at_their_optimizer_step_are_timed_alike_wherever_they_are_seen_to_begin(clock: FakeClock) -> None:
    # a measured step is seen from its forward, one left alone from its optimizer step (0.9 ms later): ended at
    # the optimizer step, both are timed from the end of the step before, and the offset is no cost
    budget, measured = Budget(0.03, every=1), 0
    for step in range(300):
        chosen = budget.decide(step)
        if not chosen:
            clock.now += 0.9e-3  # forward and backward, unseen
        assert budget.begin(step) is chosen
        if chosen:
            measured += step > WARMUP_STEPS
            budget.add_own(2e-5)
            clock.now += 0.9e-3 + 2e-5
        clock.now += 0.1e-3  # the optimizer step
        budget.end()
    summary = budget.summary()
    assert summary["after_warmup"]["seconds"] == pytest.approx(2e-5 * measured)
    assert measured > 250  # 2 % of the step: nearly every step is measured


def test_gradient_accumulation_steps_left_alone_or_measured_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule(monkeypatch, {0, 2, 5})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    outputs: list[list[torch.Tensor]] = []
    model[0].register_forward_hook(lambda m, a, out: outputs[-1].append(out.detach().clone()))
    with watch(model, optimizer) as w:
        for _ in range(6):
            outputs.append([])
            for _ in range(4):  # four micro-batches, one optimizer step
                model(torch.randn(2, 3)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    results = w.results()
    assert results.steps.tolist() == [0, 2, 5]
    oracle = torch.stack([torch.cat(outputs[s]).double().mean() for s in (0, 2, 5)])
    torch.testing.assert_close(results.activations["0"]["mean"], oracle)  # the four micro-batches, together
    assert results.activations["0"]["count"].tolist() == [32.0] * 3


def test_a_closure_optimizer_and_eval_forwards_between_steps_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule(monkeypatch, {0, 3})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 1))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2)
    x, y = torch.randn(8, 3), torch.randn(8, 1)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = (model(x) - y).square().mean()
        loss.backward()
        return loss

    with watch(model, optimizer) as w:
        for _ in range(5):
            optimizer.step(closure)
            model.eval()
            with torch.no_grad():
                model(x)  # an evaluation between steps: never a step
            model.train()
    results = w.results()
    assert results.steps.tolist() == [0, 3] and results.meta["measured"]["steps"] == 5
    assert bool(torch.isfinite(results.param_grads["0.weight"]["norm"]).all())


def test_two_watches_of_one_model_each_keep_their_own_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first, second = watch(model, optimizer, every=1), watch(model, optimizer)
    schedule(monkeypatch, {0, 4})  # the budgeted one; every=1 measures every step whatever the rule
    with first, second:
        for _ in range(6):
            optimizer.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
    assert first.results().steps.tolist() == list(range(6))
    assert second.results().steps.tolist() == [0, 4]
    torch.testing.assert_close(
        first.results().activations["0"]["mean"][[0, 4]], second.results().activations["0"]["mean"]
    )


def test_a_watch_attached_again_leaves_steps_alone_again(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule(monkeypatch, {0, 1})
    model = nn.Sequential(nn.Linear(3, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    w = watch(model, optimizer)
    expected = [[(4, 1), (0, 0), (0, 0)], [(1, 0), (0, 0), (0, 0)]]
    for attachment in range(2):  # attached, detached, attached again
        hooks = []
        with w:
            for _ in range(3):
                optimizer.zero_grad()
                model(torch.randn(2, 3)).sum().backward()
                optimizer.step()
                hooks.append((ours_on(model), ours_on(model[0])))
        # after the optimizer step, the next step's hooks: measured (step 1), or left alone: followed by the driver's
        # forward pre-hook until the steps between two optimizer steps were seen whole once, then nothing at all
        assert hooks == expected[attachment], attachment
        assert ours_on(model) == ours_on(model[0]) == 0  # detached


def test_closing_a_step_after_it_ended_is_that_steps_cost_and_the_warm_ups_are_free(clock: FakeClock) -> None:
    budget, measured = Budget(0.03, every=1), []
    for step in range(400):
        if budget.begin(step):
            measured.append(step)
        clock.now += 1e-3  # the step
        budget.end()
        if step in measured:  # its row is closed when the next step begins: 30 ms in the warm-up, 5 ms after it
            closing = 30e-3 if step < WARMUP_STEPS else 5e-3
            budget.add_own(closing)
            clock.now += closing
    budget.settle()
    later = [s for s in measured if s > WARMUP_STEPS]
    assert later[0] == WARMUP_STEPS + 1  # the warm-up's last closing (30 ms) delays nothing: it is free
    gaps = {b - a for a, b in itertools.pairwise(later)}
    assert min(gaps) >= 150  # 5 ms paid back at 3 % of 1 ms a step: about 167 steps, whatever the next step was
    assert budget.summary()["after_warmup"]["seconds"] == pytest.approx(5e-3 * len(later))
    assert budget.total == pytest.approx(400e-3)  # the closings are no step's time


def test_a_step_slowed_by_the_measured_step_before_it_is_the_measurings_cost(clock: FakeClock) -> None:
    budget, measured = Budget(0.03, every=1), []
    for step in range(1000):
        if budget.begin(step):
            measured.append(step)
            budget.add_own(1e-3)
            clock.now += 1e-3
        elif step - 1 in measured and step > WARMUP_STEPS + 1:
            clock.now += 3e-3  # caches the measuring emptied, refilled: nothing hookscope times
        clock.now += 1e-3
        budget.end()
    budget.settle()
    later = [s for s in measured if s > WARMUP_STEPS]
    # 1 ms measured and 3 ms in the step after, paid back at 3 % of 1 ms a step: one measured step in about 133
    assert later and all(b - a >= 125 for a, b in itertools.pairwise(later))
    assert budget.summary()["after_warmup"]["seconds"] == pytest.approx(4e-3 * len(later), rel=0.01)


def test_a_slow_step_left_alone_moves_the_typical_step_time_as_one_a_quarter_slower_would(clock: FakeClock) -> None:
    budget = Budget(None, every=10**6)  # step 0 measured, the others left alone
    for step, seconds in enumerate([1e-3, 1e-3, 4e-3, 2e-3, 0.5e-3]):
        budget.begin(step)
        clock.now += seconds
        budget.end()
    budget.settle()
    typical = 1e-3  # the first step left alone sets it; then an EMA of weight 0.1 with slow steps capped
    for seconds in (4e-3, 2e-3, 0.5e-3):  # a collection, a busy machine: as 1.25 typical; a faster one: as it is
        typical += 0.1 * (min(seconds, _budget.SLOWER * typical) - typical)
    assert budget._typical == pytest.approx(typical, rel=1e-12)
    assert budget._typical < 1.0e-3  # (an EMA of the raw times would be 1.28 ms: every measured step undercharged)


def stretch_after(budget: Budget, clock: FakeClock, step_time: float, count: int, ends: float, pause: float) -> None:
    """A step of `step_time` after the warm-up (the typical one learned), then a stretch of `count` such steps whose
    two ends take `ends` more, with a `pause` in its middle (timed apart, from its second step to its last)."""
    budget.begin(WARMUP_STEPS + 2)
    clock.now += step_time
    budget.end()
    clock.now += step_time + ends / 2  # its first step
    middle_began = clock.now
    clock.now += (count - 2) * step_time + pause
    middle = (clock.now - middle_began, count - 2)
    clock.now += step_time + ends / 2  # its last step
    budget.stretch_ended(WARMUP_STEPS + 3, count, middle)


def test_what_the_ends_of_a_stretch_take_beyond_its_middle_steps_is_charged(clock: FakeClock) -> None:
    charged = []
    for ends, pause in ((1e-3, 0.0), (0.0, 0.0), (1e-3, 10.0), (10.0, 0.0)):
        budget = Budget(0.03, every=1)
        simulate(budget, clock, WARMUP_STEPS + 2, step_time=1e-3, cost=0.0)
        own = budget.own
        stretch_after(budget, clock, 1e-3, 10, ends, pause)
        charged.append((budget.own - own, budget._credit, budget._typical))
    earned = 0.03 * 1e-3  # a step's earning: the credit is capped there
    (ends, ends_credit, typical), (none, none_credit, none_typical) = charged[:2]
    assert ends == pytest.approx(1e-3, rel=1e-9) and none == pytest.approx(0.0, abs=1e-15)
    assert none_credit == pytest.approx(earned) and ends_credit == pytest.approx(earned + 10 * earned - 1e-3)
    assert typical == none_typical == pytest.approx(1e-3, rel=1e-9)  # learned from the middle: the ends apart
    (paused, _, paused_typical), (long_ends, _, _) = charged[2:]
    assert paused == pytest.approx(0.0, abs=1e-15)  # a pause in the middle is no cost of the monitor
    assert paused_typical == pytest.approx(1e-3 * (1 + (1 - 0.9**10) * (_budget.SLOWER - 1)), rel=1e-9)
    assert long_ends == pytest.approx(_budget.ENDS * 1e-3, rel=1e-9)  # a pause at an end: `ENDS` steps at most


def test_a_stretch_foreseen_on_the_step_after_a_measured_one_reaches_the_next_measured_step(clock: FakeClock) -> None:
    """As `ActivationStats` follows batches: the step after a measured one (slower by two steps, untimed) foresees
    the stretch after it before its own cost is charged, and each stretch's ends take a quarter step more. The
    stretch sets both aside, so that it ends where the next step is measured. Dyadic times: sums are exact."""
    budget, kinds, step, ms = Budget(2**-5, every=1), [], 0, 2**-10
    while step < 6000:
        chosen = budget.begin(step)
        after = bool(kinds) and kinds[-1] == "measured" and not chosen
        kinds.append("measured" if chosen else "after" if after else "alone")
        if chosen:
            budget.add_own(ms)
            clock.now += ms
        clock.now += ms + (2 * ms if after and step > WARMUP_STEPS + 1 else 0.0)
        count = 0 if chosen else budget.stretch(step) - 1
        if count >= 2:
            budget.end()  # the stretch's first step begins
            clock.now += count * ms + ms / 4
            budget.stretch_ended(step + 1, count, ((count - 2) * ms, count - 2))
            kinds += ["stretch"] * count
            step += count
        step += 1
    budget.settle()
    late = kinds[2000:]
    runs = "".join(kind[0] for kind in late).replace("s", "")  # m(easured), a(fter), a(lone) in order
    assert runs.count("m") > 5 and set(runs.split("ma")[1:-1]) == {""}  # each stretch reaches a measured step
    measured = late.count("measured")
    # each measured step: a step measured, two after it, a quarter at the stretch's ends, paid at 1/32 of a step
    assert measured == pytest.approx(len(late) / (3.25 * 32 + 2), rel=0.05)


def test_a_resumed_run_goes_on_with_the_budget_it_saved(tmp_path: Path) -> None:
    from hookscope import load_state, save_state

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def train(w: Any, steps: int) -> None:
        for _ in range(steps):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).square().mean().backward()
            optimizer.step()

    with watch(model, optimizer) as first:
        train(first, 40)
    saved = first.stepper.budget.state_dict()
    assert saved["steps"] == 40 and saved["typical"] is not None and saved["skipped"][0] > 0
    path = save_state(tmp_path / "watch", first)  # JSON and safetensors: the budget's numbers go through JSON
    resumed = watch(model, optimizer)
    load_state(path, resumed)
    with resumed:  # the state is applied when the watch attaches to the model
        assert resumed.stepper.budget.state_dict() == saved
        train(resumed, 10)
    measured = resumed.results().meta["measured"]
    assert measured["steps"] == 50  # counted over the whole run, not from the resume
    assert resumed.stepper.budget.total > saved["total"]


def test_a_state_saved_inside_a_stretch_counts_its_steps_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule(monkeypatch, {0, 1, 30})
    model = nn.Sequential(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch(model, optimizer) as w:
        for _ in range(20):  # steps 3 to 29 are one stretch
            optimizer.zero_grad()
            model(torch.randn(8, 4)).square().mean().backward()
            optimizer.step()
        state = w.state_dict()
        assert ours_on(model) == 0  # still inside it: nothing of the watch's on the model
    assert state["budget"]["steps"] == 20 and state["optimizer_steps"] == 20


def test_the_steps_inside_a_stretch_pass_the_loop_driver_without_reaching_the_watch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Steps 3 to 29 are one stretch (step 2 is left alone after a measured step: timed alone): the loop driver's
    step post-hook lets all but the last pass (`LoopDriver.skip_steps`), and the counts read meanwhile are right."""
    schedule(monkeypatch, {0, 1, 30})
    reached: list[int] = []  # the step count the watch had when its step post-event reached it
    original = Watch.after_optimizer_step

    def counting(self: Watch, optimizer: torch.optim.Optimizer) -> None:
        reached.append(self.stepper.state.optimizer_steps)
        original(self, optimizer)

    monkeypatch.setattr(Watch, "after_optimizer_step", counting)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    numbers = []
    with watch(model, optimizer) as w:
        driver = w._driver
        assert driver is not None
        for _ in range(33):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).square().mean().backward()
            optimizer.step()
            numbers.append(driver.batch)  # read inside the stretch too: brought up to date when read
    # steps 0 to 2, the stretch's last step (29), step 30 (measured), step 31 (after a measured step: timed
    # alone); step 32 begins the next stretch
    assert reached == [0, 1, 2, 29, 30, 31]
    assert numbers == list(range(33))  # one batch a step, numbered as the loop counts them
    assert w.results().steps.tolist() == [0, 1, 30]
    assert w.results().meta["measured"]["steps"] == 33


def test_the_later_half_of_a_stretch_is_timed_apart_and_its_slower_first_steps_are_charged(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    """Steps 3 to 29 are one stretch after the measured step 1 (step 2 timed alone). Its first two steps are slower
    (caches refilled after a measured step): the driver marks when its later half (`later_part`: its last 13
    steps) begins, and what the stretch took beyond 27 steps at that pace is charged as the monitor's."""
    schedule(monkeypatch, {0, 1, 30})
    ended = record_stretches(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    took = {3: 1.5, 4: 1.5}  # seconds; every other step takes 1 s (hookscope's own work takes none here)
    with watch(model, optimizer) as w:
        for step in range(30):
            clock.now += took.get(step, 1.0)
            optimizer.zero_grad()
            model(torch.randn(8, 4)).square().mean().backward()
            optimizer.step()
        budget = w.stepper.budget
        assert _budget.later_part(27) == 13
        assert ended == [(3, 27, (13.0, 13))]  # steps 17 to 29, timed from step 16's end to step 29's
        assert budget._typical == pytest.approx(1.0)  # learned from the later half, the slow steps apart
        # the stretch took 28 s, 1 s beyond 27 steps of 1 s: charged (timing the stretch whole, nothing would be)
        assert budget.own == pytest.approx(1.0)


def test_measured_reads_what_results_report_without_a_flush() -> None:
    """`Watch.measured` is `results().meta["measured"]` without moving the measured steps' rows to the host (a
    benchmark reads it between timed blocks: a flush there would be charged inside the next block)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch(model, optimizer, every=1) as w:
        for _ in range(5):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).square().mean().backward()
            optimizer.step()
        stored = len(w.stepper.store)
        measured = w.measured
        assert len(w.stepper.store) == stored < 5  # nothing moved to the host by reading it
        assert measured["steps"] == 5 and measured["every"] == 1 and measured["recorded"] == 5
        assert w.results().meta["measured"] == w.measured  # one definition: read after the flush, the same
        assert len(w.stepper.store) == 5
