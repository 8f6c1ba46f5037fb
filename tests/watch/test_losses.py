"""The loss of every step, measured or not (`WatchResults.logged_steps` / `logged_losses`), against the values the
loop logged: kept on the device until a flush, thinned past its limit, saved, resumed, merged and read by the doctor.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from hookscope.callbacks._budget import Budget
from hookscope.doctor import diagnose
from hookscope.results import WatchResults, combine_results
from hookscope.watch import _losses, watch
from hookscope.watch._losses import LossLog


def schedule(monkeypatch: pytest.MonkeyPatch, measured: set[int]) -> None:
    """Make the budget measure exactly `measured` (its decisions, not its clock, are what these tests are about)."""
    monkeypatch.setattr(Budget, "_rule", lambda self, step, credit: step in measured)


def train(steps: int, losses: dict[int, list[float]] | None = None) -> tuple[WatchResults, dict[int, list[float]]]:
    """A watched loop that logs its loss (twice at every third step) and returns what it logged, per step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    logged: dict[int, list[float]] = {} if losses is None else losses
    with watch(model, optimizer) as w:
        for step in range(steps):
            optimizer.zero_grad()
            loss = model(torch.randn(4, 3)).square().mean()
            loss.backward()
            optimizer.step()
            w.log_loss(loss)
            logged.setdefault(step, []).append(loss.item())
            if step % 3 == 0:
                w.log_loss(2.0 * loss.item())  # a second loss in the step (a float): the step keeps the mean
                logged[step].append(2.0 * loss.item())
    return w.results(), logged


def test_every_step_has_its_loss_measured_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule(monkeypatch, {0, 4, 9})
    results, logged = train(12)
    assert results.steps.tolist() == [0, 4, 9]
    assert results.logged_steps is not None and results.logged_losses is not None
    assert results.logged_steps.tolist() == list(range(12))
    oracle = torch.tensor([sum(v) / len(v) for v in logged.values()], dtype=torch.float64)
    torch.testing.assert_close(results.logged_losses, oracle)
    assert results.losses is not None
    torch.testing.assert_close(results.losses, oracle[[0, 4, 9]])  # the measured steps' losses, the same values
    assert results.dropped["sampling_loss"] == sum(len(logged[s]) for s in range(12) if s not in (0, 4, 9))


def test_more_steps_than_the_device_slots_go_to_the_host_as_they_fill(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_losses, "SLOTS", 8)
    schedule(monkeypatch, {0})
    results, logged = train(30)
    assert results.logged_steps is not None and results.logged_steps.tolist() == list(range(30))
    oracle = torch.tensor([sum(v) / len(v) for v in logged.values()], dtype=torch.float64)
    torch.testing.assert_close(results.logged_losses, oracle)


def test_past_its_limit_the_log_keeps_an_even_subset_with_the_first_and_latest_steps() -> None:
    log = LossLog(limit=10)
    for step in range(37):
        log.add(step, torch.tensor(float(step), dtype=torch.float64))
        if step % 5 == 4:
            log.take()
    table = log.table()
    assert table is not None
    steps, losses = table
    assert len(steps) <= 10 + 1 and steps[0] == 0 and steps[-1] == 36  # the limit, and the latest step
    assert set(torch.diff(steps[:-1]).tolist()) == {log.stride}  # evenly spaced, the latest aside
    torch.testing.assert_close(losses, steps.double())  # each kept step keeps its own loss


def test_a_step_taken_in_two_flushes_keeps_the_mean_of_all_its_losses() -> None:
    log = LossLog(limit=None)
    log.add(3, torch.tensor(1.0, dtype=torch.float64))
    log.take()  # results() read in the middle of step 3
    log.add(3, torch.tensor(4.0, dtype=torch.float64))
    log.add(4, torch.tensor(math.nan, dtype=torch.float64))
    table = log.table()
    assert table is not None
    assert table[0].tolist() == [3, 4] and table[1][0] == 2.5 and math.isnan(table[1][1])


def test_the_logged_losses_are_saved_loaded_and_resumed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    schedule(monkeypatch, {0, 5})
    results, _ = train(7)
    loaded = WatchResults.load(results.save(tmp_path / "r.safetensors"))
    assert loaded.logged_steps is not None and torch.equal(loaded.logged_steps, results.logged_steps)
    assert loaded.logged_losses is not None and torch.equal(loaded.logged_losses, results.logged_losses)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch(model, optimizer) as first:
        for _ in range(3):
            model(torch.randn(2, 3)).sum().backward()
            first.log_loss(1.5)
            optimizer.step()
    resumed = watch(model, optimizer)
    resumed.load_state_dict(first.state_dict())
    with resumed:
        model(torch.randn(2, 3)).sum().backward()
        resumed.log_loss(2.5)
        optimizer.step()
    later = resumed.results()
    assert later.logged_steps is not None and later.logged_steps.tolist() == [0, 1, 2, 3]
    assert later.logged_losses is not None and later.logged_losses.tolist() == [1.5, 1.5, 1.5, 2.5]


def test_ranks_logged_losses_are_averaged_over_the_ranks_that_logged_them() -> None:
    def part(steps: list[int], losses: list[float]) -> WatchResults:
        return WatchResults(
            logged_steps=torch.tensor(steps, dtype=torch.int64), logged_losses=torch.tensor(losses, dtype=torch.float64)
        )

    merged = combine_results([part([0, 1, 2], [1.0, 2.0, math.inf]), part([1, 2, 3], [4.0, 6.0, 8.0])])
    assert merged.logged_steps is not None and merged.logged_steps.tolist() == [0, 1, 2, 3]
    assert merged.logged_losses is not None and merged.logged_losses.tolist() == [1.0, 3.0, math.inf, 8.0]


def test_a_nan_loss_in_a_step_not_measured_is_found_at_its_own_step(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule(monkeypatch, {0, 1, 2, 9})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch(model, optimizer) as w:
        for step in range(10):
            optimizer.zero_grad()
            x = torch.randn(4, 3)
            loss = model(x).square().mean()
            w.log_loss(loss if step != 6 else loss * math.nan)  # a broken loss, logged at step 6 only
            loss.backward()
            optimizer.step()
    findings = [f for f in diagnose(w.results()) if f.check == "nonfinite_forward"]
    assert [(f.step, f.path) for f in findings] == [(6, None)]
    assert "not measured" in findings[0].message and math.isnan(findings[0].evidence["loss"])


def test_a_loss_spike_between_measured_steps_is_found_at_the_step_it_began() -> None:
    generator = torch.Generator().manual_seed(0)
    every = torch.arange(400)
    losses = 2.0 + 0.01 * torch.rand(400, generator=generator, dtype=torch.float64)
    losses[237:] += 3.0  # a jump that lasts, at a step no measured step falls on
    measured = every[::25].clone()
    results = WatchResults(
        steps=measured,
        losses=losses[measured],
        loss_counts=torch.ones(len(measured), dtype=torch.float64),
        logged_steps=every,
        logged_losses=losses,
    )
    spikes = [f for f in diagnose(results) if f.check == "loss_spike"]
    assert [f.step for f in spikes] == [237]
    assert spikes[0].evidence["loss_before"] == pytest.approx(float(losses[:237].median()), abs=0.01)
