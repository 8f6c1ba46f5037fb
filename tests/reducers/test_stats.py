"""StatsReducer against a naive full-tensor oracle: every value concatenated and reduced in float64."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hookscope.reducers import StatsReducer
from stats_oracle import expected, values_of

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32]
TOLERANCE = {torch.float16: 1e-5, torch.bfloat16: 1e-5, torch.float32: 1e-5, torch.float64: 1e-10, torch.int32: 1e-10}


def _batches(seed: int, shapes: list[tuple[int, ...]], dtype: torch.dtype, scale: float) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=generator) * scale + scale / 3).to(dtype) for shape in shapes]


def _oracle(batches: list[torch.Tensor]) -> dict[str, float]:
    wanted = expected(values_of(*batches))
    names = ("count", "mean", "std", "min", "max", "norm", "nonfinite", "near_zero")
    return {name: getattr(wanted, name) for name in names}


shapes = st.lists(
    st.tuples(st.integers(1, 6), st.integers(1, 5)).map(lambda s: s[: 1 + s[0] % 2]), min_size=1, max_size=6
)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    shapes=shapes,
    dtype=st.sampled_from(DTYPES),
    scale=st.sampled_from([1e-3, 1.0, 300.0]),
)
def test_matches_the_oracle(seed: int, shapes: list[tuple[int, ...]], dtype: torch.dtype, scale: float) -> None:
    batches = _batches(seed, shapes, dtype, scale)
    reducer = StatsReducer()
    for batch in batches:
        reducer.push(batch)
    stats, oracle = reducer.peek(), _oracle(batches)
    assert stats is not None
    assert int(stats.count) == oracle["count"] and int(stats.nonfinite) == oracle["nonfinite"]
    rtol = TOLERANCE[dtype]
    for name in ("mean", "min", "max", "norm", "std", "near_zero"):
        assert getattr(stats, name).item() == pytest.approx(oracle[name], rel=rtol, abs=rtol * scale)
    assert stats.var.item() == pytest.approx(oracle["std"] ** 2, rel=1e-4, abs=rtol * scale**2)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), left=shapes, right=shapes)
def test_combine_equals_pushing_everything_into_one(
    seed: int, left: list[tuple[int, ...]], right: list[tuple[int, ...]]
) -> None:
    first, second = _batches(seed, left, torch.float32, 2.0), _batches(seed + 1, right, torch.float32, 5.0)
    merged, other, single = StatsReducer(), StatsReducer(), StatsReducer()
    for batch in first:
        merged.push(batch)
    for batch in second:
        other.push(batch)
    for batch in first + second:
        single.push(batch)
    merged = merged.combine(other)
    expected, got = single.peek(), merged.peek()
    assert expected is not None and got is not None
    for name, value in expected.as_dict().items():
        torch.testing.assert_close(getattr(got, name), value, rtol=1e-9, atol=1e-9)
    assert merged.pushes == single.pushes


def test_combine_with_an_empty_reducer_either_side() -> None:
    full, empty = StatsReducer(), StatsReducer()
    full.push(torch.tensor([1.0, 3.0]))
    full, empty = full.combine(StatsReducer()), empty.combine(full)
    for reducer in (full, empty):
        stats = reducer.peek()
        assert stats is not None and (int(stats.count), stats.mean.item()) == (2, 2.0)
        assert stats.var.item() == pytest.approx(2.0, rel=1e-12)


def test_combine_refuses_other_reducers() -> None:
    from hookscope.reducers import EMAReducer

    with pytest.raises(TypeError, match="other must be a StatsReducer, got EMAReducer"):
        StatsReducer().combine(EMAReducer(0.1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="other must count near-zero values as this reducer does"):
        StatsReducer().combine(StatsReducer(near_zero=0.5))


def test_fp16_values_of_300_stay_finite_and_match_fp32() -> None:
    values = torch.full((4096,), 300.0, dtype=torch.float16) + torch.linspace(-4, 4, 4096).half()
    assert not torch.isfinite(values.square().sum())  # the naive fp16 sum of squares overflows
    reducer = StatsReducer()
    reducer.push(values)
    stats, reference = reducer.peek(), values.float()
    assert stats is not None
    assert stats.mean.item() == pytest.approx(reference.mean().item(), rel=1e-6)
    assert stats.var.item() == pytest.approx(reference.var(correction=1).item(), rel=1e-4)
    assert stats.norm.item() == pytest.approx(reference.norm().item(), rel=1e-6)
    assert all(torch.isfinite(t) for t in (stats.mean, stats.var, stats.norm))


def test_non_finite_values_are_counted_not_averaged() -> None:
    reducer = StatsReducer()
    reducer.push(torch.tensor([1.0, float("nan"), float("inf"), 3.0, float("-inf")]))
    stats = reducer.peek()
    assert stats is not None
    assert (int(stats.count), int(stats.nonfinite), stats.mean.item(), stats.max.item()) == (2, 3, 2.0, 3.0)


def test_one_value_has_zero_variance_and_no_value_has_nan_mean() -> None:
    one, none = StatsReducer(), StatsReducer()
    one.push(torch.tensor([5.0]))
    none.push(torch.tensor([float("nan")]))
    none.push(torch.empty(0))
    stats_one, stats_none = one.peek(), none.peek()
    assert stats_one is not None and stats_none is not None
    assert (stats_one.var.item(), stats_one.std.item()) == (0.0, 0.0)
    assert int(stats_none.count) == 0 and stats_none.mean.isnan() and stats_none.min.isnan()
    assert StatsReducer().peek() is None


def test_many_tiny_increments_do_not_drift() -> None:
    reducer = StatsReducer()
    batch = torch.full((1000,), 1e-8, dtype=torch.float64) + torch.arange(1000, dtype=torch.float64) * 1e-12
    for _ in range(1000):
        reducer.push(batch)
    stats = reducer.peek()
    assert stats is not None
    assert stats.mean.item() == pytest.approx(batch.mean().item(), rel=1e-12)
    assert stats.var.item() == pytest.approx(batch.var(correction=1).item(), rel=1e-9)


def test_near_zero_must_be_a_finite_non_negative_number() -> None:
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"near_zero must be a (finite )?number( >= 0)?, got"):
            StatsReducer(near_zero=bad)
    with pytest.raises(TypeError, match=r"near_zero must be a number, got True"):
        StatsReducer(near_zero=True)  # type: ignore[arg-type]


def test_dump_adds_a_leading_dimension() -> None:
    reducer = StatsReducer()
    reducer.push(torch.arange(4.0))
    dumped = reducer.dump()
    assert dumped is not None and dumped.mean.shape == (1,) and dumped.mean.item() == 1.5
