"""A step without a logged loss has an unknown loss, never a non-finite one: in the results, the doctor, the saved
file and merges (issue 27: `log_loss` every 5 steps raised a red `nonfinite_forward` ERROR on a healthy run)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from hookscope.doctor import diagnose
from hookscope.results import WatchResults, combine_results
from hookscope.watch import watch


def run(log: list[float | None]) -> WatchResults:
    """Train a small model one step per entry of `log`, logging that loss value (`None`: no loss logged)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, optimizer, every=1) as w:
        for value in log:
            optimizer.zero_grad()
            loss = model(torch.randn(4, 3)).square().mean()
            loss.backward()
            optimizer.step()
            if value is not None:
                w.log_loss(value)
    return w.results()


def test_a_loss_logged_every_fifth_step_is_unknown_elsewhere_and_raises_no_finding() -> None:
    log = [float(k) if k % 5 == 0 else None for k in range(12)]
    results = run(log)
    assert results.losses is not None and results.loss_counts is not None
    assert results.loss_logged().tolist() == [value is not None for value in log]
    assert results.losses[0] == 0.0 and results.losses[5] == 5.0 and bool(torch.isnan(results.losses[1]))
    assert [f.check for f in diagnose(results) if f.check.startswith("nonfinite")] == []


def test_a_logged_non_finite_loss_is_still_found() -> None:
    results = run([1.0, None, float("nan"), 1.0])
    found = [f for f in diagnose(results) if f.check == "nonfinite_forward"]
    assert [f.step for f in found] == [2]


def test_the_unknown_loss_survives_saving_and_combining(tmp_path: Path) -> None:
    with_loss = run([1.0, None, 3.0])
    loaded = WatchResults.load(with_loss.save(tmp_path / "r.safetensors"))
    assert loaded.loss_logged().tolist() == [True, False, True]
    other = run([None, 2.0, float("inf")])
    combined = combine_results([with_loss, other])
    # the mean over the parts that logged one; a non-finite one stays non-finite; none logged stays unknown
    assert combined.losses is not None and combined.loss_logged().tolist() == [True, True, True]
    assert combined.losses[:2].tolist() == [1.0, 2.0] and combined.losses[2] == float("inf")
    unknown = combine_results([run([None, None]), run([None, 1.0])])
    assert unknown.loss_logged().tolist() == [False, True]
