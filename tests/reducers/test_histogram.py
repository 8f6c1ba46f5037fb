"""HistogramReducer against numpy.histogram of every value pushed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hookscope.reducers import HistogramReducer


def _batches(seed: int, scales: list[float], dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, 7, generator=generator) * scale).to(dtype) for scale in scales]


def _values(batches: list[torch.Tensor]) -> np.ndarray:
    return torch.cat([b.reshape(-1).double() for b in batches]).numpy()


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    scales=st.lists(st.sampled_from([0.0, 1e-3, 0.7, 3.0, 40.0]), min_size=1, max_size=6),
    bins=st.sampled_from([2, 4, 10, 32]),
    dtype=st.sampled_from([torch.float16, torch.float32, torch.float64]),
)
def test_automatic_range_matches_a_histogram_made_at_the_end(
    seed: int, scales: list[float], bins: int, dtype: torch.dtype
) -> None:
    batches = _batches(seed, scales, dtype)
    reducer = HistogramReducer(bins=bins)
    for batch in batches:
        reducer.push(batch)
    values = _values(batches)
    largest = float(np.abs(values).max())
    radius = 2.0 ** (math.floor(math.log2(largest)) + 1) if largest > 0 else 1.0
    expected, edges = np.histogram(values, bins=bins, range=(-radius, radius))
    counts = reducer.peek()
    assert counts is not None and counts.tolist() == expected.tolist()
    np.testing.assert_allclose(reducer.edges().numpy(), edges, rtol=1e-12, atol=1e-12 * radius)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    scales=st.lists(st.sampled_from([0.1, 1.0, 5.0]), min_size=1, max_size=4),
    bins=st.integers(1, 12),
)
def test_fixed_range_matches_numpy_and_counts_what_falls_outside(seed: int, scales: list[float], bins: int) -> None:
    batches = _batches(seed, scales, torch.float32)
    reducer = HistogramReducer(bins=bins, range=(-1.5, 2.0))
    for batch in batches:
        reducer.push(batch)
    values = _values(batches)
    expected, _ = np.histogram(values, bins=bins, range=(-1.5, 2.0))
    counts = reducer.peek()
    assert counts is not None and counts.tolist() == expected.tolist()
    assert int(reducer.underflow) == int((values < -1.5).sum())
    assert int(reducer.overflow) == int((values > 2.0).sum())


def test_negative_values_are_kept_and_non_finite_ones_counted_apart() -> None:
    reducer = HistogramReducer(bins=4)
    reducer.push(torch.tensor([-3.0, -0.5, float("nan"), 0.5, float("inf")]))
    counts = reducer.peek()
    assert counts is not None and counts.tolist() == [1, 1, 1, 0]
    assert int(reducer.nonfinite) == 2
    assert reducer.edges().tolist() == [-4.0, -2.0, 0.0, 2.0, 4.0]


def test_growth_keeps_old_counts_in_the_bins_that_contain_them() -> None:
    reducer = HistogramReducer(bins=4)
    reducer.push(torch.tensor([-0.9, -0.1, 0.1, 0.9]))  # radius 1: one value per bin
    reducer.push(torch.tensor([7.0]))  # radius 8: edges -8, -4, 0, 4, 8
    counts = reducer.peek()
    assert counts is not None and counts.tolist() == [0, 2, 2, 1]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"bins": 3}, "bins must be a positive even int"),
        ({"bins": 0, "range": (0.0, 1.0)}, "bins must be a positive int, got 0"),
        ({"bins": 4, "range": (1.0, 1.0)}, r"range must be a pair \(low, high\) of finite numbers with low < high"),
        ({"bins": 4, "range": (0.0, float("inf"))}, "range must be a pair"),
    ],
)
def test_arguments_are_checked(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HistogramReducer(**arguments)  # type: ignore[arg-type]
