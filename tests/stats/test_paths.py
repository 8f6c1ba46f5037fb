"""The same tensor through every path -- StatsReducer, ActivationStats, watch() small and large, results combined
across parts -- gives the oracle's numbers (one tensor per example, drawn by the engine's property strategy)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st
from test_engine import SETTINGS, tensors

from hookscope.callbacks import ActivationStats, LoopDriver
from hookscope.reducers import StatsReducer
from hookscope.results import combine_results
from hookscope.stats._tables import SMALL_BELOW
from hookscope.watch import watch
from stats_oracle import Expected, close, expected, values_of

MOMENTS = ("mean", "std", "min", "max")


class Emit(nn.Module):
    """Outputs a given tensor, unchanged (times a parameter equal to one), so every path sees exactly it."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.value = value
        self.weight = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.value * self.weight.detach().to(self.value.dtype)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.zeros(1))
    model.weight.sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _watched(x: torch.Tensor, **options: Any) -> dict[str, float]:
    """watch()'s activation statistics of one training step whose watched output is `x`."""
    model = Emit(x)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with watch(model, optimizer, select="", groups=("activations",), **options) as w:
        _step(model, optimizer)
    return {name: float(column[0]) for name, column in w.results().activations[""].items()}


def _check(
    got: dict[str, float], wanted: Expected, names: tuple[str, ...] = MOMENTS, path: str = "", rtol: float = 1e-7
) -> None:
    """`names` of `got` against the oracle, relative to the largest finite magnitude (NaN only where it is NaN)."""
    scale = max(abs(wanted.min), abs(wanted.max)) if wanted.count else 1.0
    for name in names:
        assert close(got[name], getattr(wanted, name), scale, rtol), (path, name, got[name], wanted)


@SETTINGS
@given(x=tensors())
def test_one_tensor_gives_the_oracle_numbers_through_every_path(x: torch.Tensor) -> None:
    wanted = expected(values_of(x))
    counts = {"count": float(wanted.count), "nonfinite": float(wanted.nonfinite)}

    reducer = StatsReducer()
    reducer.push(x)
    described = reducer.peek()
    assert described is not None
    reduced = {name: float(getattr(described, name)) for name in (*MOMENTS, "count", "nonfinite", "near_zero")}
    _check(reduced, wanted, (*MOMENTS, "near_zero"), "StatsReducer")
    assert {k: reduced[k] for k in counts} == counts

    watched = _watched(x)
    _check(watched, wanted, (*MOMENTS, "rms", "near_zero"), "watch")
    assert {k: watched[k] for k in counts} == counts
    assert watched["sampled"] == 0.0 or (x.numel() == 0 and math.isnan(watched["sampled"]))  # 0 of 0 values: NaN

    model = Emit(x)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    activation_stats = ActivationStats(modules=[model])
    with LoopDriver([activation_stats], model, optimizer):
        _step(model, optimizer)
    entry = activation_stats.stats[0][0]
    _check(entry, wanted, ("mean", "std"), "ActivationStats", rtol=1e-6)  # its records are float32, as fastai's
    fastai = expected(values_of(x), near_zero=0.05, signed=True)  # its documented rule: x <= 0.05, signed
    assert close(entry["near_zero"], fastai.near_zero, 1.0, 1e-6)


@SETTINGS
@given(parts=st.lists(tensors(max_size=80), min_size=2, max_size=4))
def test_results_combined_across_parts_equal_the_oracle_of_all_values(parts: list[torch.Tensor]) -> None:
    """Each part watched by its own watch (as a rank would), combined: the statistics of every value at once."""
    results = []
    for part in parts:
        model = Emit(part)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        with watch(model, optimizer, select="", groups=("activations",)) as w:
            _step(model, optimizer)
        results.append(w.results())
    combined = combine_results(results)
    got = {name: float(column[0]) for name, column in combined.activations[""].items()}
    wanted = expected(values_of(*parts))
    _check(got, wanted, (*MOMENTS, "rms", "near_zero"), "combine_results")
    assert (got["count"], got["nonfinite"]) == (wanted.count, wanted.nonfinite)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("offset", [0.0, 30.0])
def test_a_large_tensor_gives_the_oracle_numbers_exactly_or_within_the_sampling_bounds(
    dtype: torch.dtype, offset: float
) -> None:
    """Above SMALL_BELOW: `exact=True` gives the oracle's numbers; sampled, the count, mean, min and max stay exact,
    std too while |mean| <= 4 std (from the exact sums), else within 2 % (non-finite values: test_sampled.py)."""
    x = (torch.randn(SMALL_BELOW + 4099) * 2 + offset).to(dtype)
    wanted = expected(values_of(x))
    exact = _watched(x, exact=True)
    _check(exact, wanted, (*MOMENTS, "rms", "near_zero"), "watch exact")
    assert (exact["count"], exact["nonfinite"], exact["sampled"]) == (wanted.count, wanted.nonfinite, 0.0)

    sampled = _watched(x)
    assert (sampled["sampled"], sampled["count"], sampled["nonfinite"]) == (1.0, wanted.count, 0.0)
    _check(sampled, wanted, ("mean", "min", "max"), "watch sampled")
    # From every value's sums (accumulated in float32) while |mean| <= 4 std; else the sample's estimate.
    assert sampled["std"] == pytest.approx(wanted.std, rel=0.02 if offset else 1e-5)
