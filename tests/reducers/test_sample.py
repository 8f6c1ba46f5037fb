"""ReservoirReducer and QuantileReducer: a uniform, deterministic, bounded sample of the values pushed."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hookscope.reducers import QuantileReducer, ReservoirReducer


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6), capacity=st.integers(1, 50))
def test_sample_is_drawn_from_the_values_pushed_and_bounded(sizes: list[int], capacity: int) -> None:
    start, batches = 0, []
    for size in sizes:
        batches.append(torch.arange(start, start + size, dtype=torch.float32))
        start += size
    reservoir = ReservoirReducer(capacity=capacity)
    for batch in batches:
        reservoir.push(batch)
    sample = reservoir.peek()
    assert sample is not None
    values = sample.tolist()
    assert len(values) == min(capacity, start) and len(set(values)) == len(values)
    assert set(values) <= set(range(start)) and values == sorted(values)  # oldest first
    assert reservoir.dropped == start - len(values) and reservoir.seen == start


def test_every_value_is_equally_likely_to_be_kept() -> None:
    hits = torch.zeros(20)
    for seed in range(400):
        reservoir = ReservoirReducer(capacity=5, seed=seed)
        reservoir.push(torch.arange(12.0))
        reservoir.push(torch.arange(12.0, 20.0))
        sample = reservoir.peek()
        assert sample is not None
        hits[sample.long()] += 1
    frequency = hits / 400  # each value is kept with probability 5 / 20
    assert torch.all((frequency - 0.25).abs() < 0.1), frequency


def test_same_seed_same_sample_and_non_finite_values_are_never_kept() -> None:
    samples = []
    for _ in range(2):
        reservoir = ReservoirReducer(capacity=4, seed=7)
        reservoir.push(torch.tensor([1.0, float("nan"), 2.0, float("inf"), 3.0, 4.0, 5.0]))
        samples.append(reservoir.peek())
        assert int(reservoir.nonfinite) == 2
    assert samples[0] is not None and torch.equal(samples[0], samples[1])
    assert bool(torch.isfinite(samples[0]).all())


def test_quantiles_are_exact_while_everything_fits() -> None:
    values = torch.randn(300)
    quantiles = QuantileReducer([0.1, 0.5, 0.9], capacity=1000)
    for chunk in values.split(70):
        quantiles.push(chunk)
    estimate = quantiles.peek()
    assert estimate is not None
    torch.testing.assert_close(estimate, torch.quantile(values.double(), torch.tensor([0.1, 0.5, 0.9]).double()))
    dumped = quantiles.dump()
    assert dumped is not None and torch.equal(dumped.float(), values)


def test_quantile_of_only_non_finite_values_is_nan() -> None:
    reservoir = ReservoirReducer(capacity=3)
    reservoir.push(torch.tensor([float("nan")]))
    estimate = reservoir.quantile(0.5)
    assert estimate is not None and estimate.isnan()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ReservoirReducer(capacity=0), "capacity must be a positive int, got 0"),
        (lambda: QuantileReducer(1.5), r"q must be a level or a non-empty sequence of levels in \[0, 1\], got 1.5"),
        (lambda: QuantileReducer([]), "q must be a level"),
    ],
)
def test_arguments_are_checked(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]
    with pytest.raises(TypeError, match="seed must be an int, got 1.5"):
        ReservoirReducer(capacity=3, seed=1.5)  # type: ignore[arg-type]


def test_quantile_levels_are_checked_when_read() -> None:
    reservoir = ReservoirReducer(capacity=3)
    reservoir.push(torch.ones(3))
    with pytest.raises(ValueError, match=r"q must be in \[0, 1\] \(every level\), got -0.1"):
        reservoir.quantile(-0.1)
    for level in (math.nan, [0.5, math.nan]):  # used to raise torch's RuntimeError
        with pytest.raises(ValueError, match=r"q must be in \[0, 1\] \(every level\), got .*nan"):
            reservoir.quantile(level)
    with pytest.raises(
        TypeError, match="q must be a level in \\[0, 1\\], or a sequence or tensor of them, got 'median'"
    ):
        ReservoirReducer(capacity=3).quantile("median")  # type: ignore[arg-type]
