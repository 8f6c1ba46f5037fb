"""Results with known series for the plot tests: what is drawn must be exactly what was recorded."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hookscope.results import WatchResults


def known_results(steps: int = 6, layers: tuple[str, ...] = ("0", "2")) -> WatchResults:
    """Return WatchResults whose every series is a simple function of (layer index, step)."""
    s = torch.arange(steps, dtype=torch.float32)
    results = WatchResults(steps=torch.arange(steps), layers={path: "Linear" for path in layers})
    for i, path in enumerate(layers):
        results.activations[path] = {"mean": s * (i + 1), "std": s + i + 1, "near_zero": torch.full((steps,), 0.1 * i)}
        results.output_grads[path] = {"norm": 10.0 ** -(s + i)}
        results.param_grads[f"{path}.weight"] = {"norm": 2.0 ** -(s + i)}
        results.update_ratios[f"{path}.weight"] = torch.full((steps,), 10.0 ** -(i + 2))
        results.histograms[path] = torch.arange(steps * 4, dtype=torch.float32).reshape(steps, 4)
        results.hist_edges[path] = torch.linspace(-1, 1, 5)
        results.unit_activity[path] = torch.tensor([0.0, 0.5, 1.0, 0.25])
    results.losses = 1.0 / (s + 1)
    return results


@pytest.fixture
def results() -> WatchResults:
    return known_results()


@pytest.fixture
def make_results() -> Callable[..., WatchResults]:
    return known_results
