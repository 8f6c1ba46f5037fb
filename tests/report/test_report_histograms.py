"""The report's histogram heatmaps of real models show a distribution, not a pile-up at the edges of a range."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hookscope.report._data import load_data, prepare_data, save_data
from realmodels.zoo import healthy


@pytest.mark.parametrize("name", ["gpt2", "bert", "tv_mobilenet_v3", "mobilenet_v2"])
def test_the_last_steps_histograms_are_spread_inside_their_range(tmp_path: Path, name: str) -> None:
    save_data(tmp_path, prepare_data(healthy(name).results, None, None, None, None))
    results = load_data(tmp_path).results  # what the report draws its heatmaps from
    assert set(results.histograms) == set(results.layers)
    degenerate = {}
    for path, counts in results.histograms.items():
        last = counts[-1].to(torch.float64)  # (bins,) at the last recorded step
        total = float(last.sum())
        edges = float((last[0] + last[-1]).sum()) / total if total else 1.0
        used = int((last > 0).sum())
        if not total or edges > 0.1 or used < 3:  # empty, piled up in the end bins, or one spike
            degenerate[path] = f"{edges:.0%} of {total:.0f} values in the end bins, {used} bins used"
    assert degenerate == {}, degenerate
