"""A patching sweep shows its progress on a terminal (cells done / all cells, after each forward), clears it, and
gives the same effects as without; off a terminal, or with `progress=False`, nothing is written."""

from __future__ import annotations

import io
import sys

import pytest
import torch

import hookscope._progress as progress_module
from fake_terminal import Terminal, counts, is_clear
from hookscope import steer
from hookscope._errors import HookscopeWarning

from .models import SEQ, AttentionOnly, induction_pair


@pytest.fixture
def every_drawing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Draw at every count (no delay, no interval), so a fast sweep shows each of its forwards."""
    monkeypatch.setattr(progress_module, "DELAY", 0.0)
    monkeypatch.setattr(progress_module, "INTERVAL", 0.0)


def _sweep(**options: object) -> steer.PatchResult:
    torch.manual_seed(0)  # the same weights on every call
    model = AttentionOnly().eval()
    clean, corrupted, metric, _ = induction_pair(4, source=4)
    sites = ["embedded", "blocks.0.attn.out_proj"]  # the second gives fractional effects: a real comparison
    return steer.patch(model, clean, corrupted, metric, select=sites, positions="each", **options)  # type: ignore[arg-type]


def test_on_a_terminal_the_sweep_counts_its_cells_and_clears_the_line(
    monkeypatch: pytest.MonkeyPatch, every_drawing: None
) -> None:
    quiet = _sweep(batch_size=5, progress=False)  # the oracle: the same sweep without a line
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    shown = _sweep(batch_size=5)
    total = 2 * SEQ  # two sites x every position
    after_each_forward = [min(done, total) for done in range(5, total + 5, 5)]
    drawn = counts(terminal.getvalue(), "cells")
    assert drawn == [(done, total) for done in [*after_each_forward, total]]  # rich draws the end once more
    assert is_clear(terminal.getvalue())
    fractional = quiet.effects[1].nan_to_num()
    assert ((fractional != 0) & (fractional.abs() != 1)).any()
    assert torch.equal(shown.effects, quiet.effects) and shown.sites == quiet.sites
    assert shown.metric_clean == quiet.metric_clean and shown.metric_corrupted == quiet.metric_corrupted


@pytest.mark.parametrize(("stream", "progress"), [(io.StringIO(), None), (Terminal(), False)])
def test_off_a_terminal_or_turned_off_nothing_is_written(
    monkeypatch: pytest.MonkeyPatch, every_drawing: None, stream: io.StringIO, progress: bool | None
) -> None:
    monkeypatch.setattr(sys, "stderr", stream)
    _sweep(batch_size=5, progress=progress)
    assert stream.getvalue() == ""


def test_a_fast_sweep_draws_nothing_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(progress_module, "DELAY", 3600.0)  # the sweep ends before the delay, on any machine
    _sweep(batch_size=5)
    assert terminal.getvalue() == ""


@pytest.mark.parametrize("function", [steer.patch, steer.attribution_patch])
def test_progress_must_be_a_bool_or_none(function: object) -> None:
    model = AttentionOnly().eval()
    clean, corrupted, metric, _ = induction_pair(2)
    with pytest.raises(TypeError, match=r"progress must be .*bool.*got 'yes'"):
        function(model, clean, corrupted, metric, select="embedded", progress="yes")  # type: ignore[operator]


def test_asking_for_progress_without_rich_warns_at_the_callers_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    with pytest.warns(HookscopeWarning, match="progress=True needs rich") as caught:
        _sweep(batch_size=5, progress=True)
    assert caught[0].filename == __file__
