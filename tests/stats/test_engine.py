"""The statistics engine against the one float64 NumPy oracle: every path, every dtype, NaN/inf, extremes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hookscope.stats._batched import Segments, Workspace, describe_segments, norm_segments
from hookscope.stats._describe import describe, describe_large
from hookscope.stats._histogram import (
    EXPONENT_NONE,
    OVERFLOW,
    UNDERFLOW,
    auto_edges,
    check_range,
    exponent_of,
    exponent_of_edges,
    fixed_edges,
    rebin,
    row_counts,
    segment_counts,
)
from hookscope.stats._histogram import counts as histogram_counts
from hookscope.stats._norms import NORM, combine_norms, norm_of
from hookscope.stats._record import STATISTICS, Column, combine, empty, finalize, from_statistics
from hookscope.stats._sample import Sampler
from hookscope.stats._spec import Spec, accumulate_dtype, wide_dtype
from stats_oracle import Expected, auto_exponent, auto_histogram, close, expected, fixed_histogram, values_of

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@st.composite
def tensors(draw: st.DrawFn, max_size: int = 300) -> torch.Tensor:
    """Random shapes and dtypes; normal values at a random scale and offset, constants, extremes near the dtype's
    largest finite value, and a sprinkle of NaN and ±inf."""
    dtype = draw(st.sampled_from(DTYPES))
    size = draw(st.integers(0, max_size))
    kind = draw(st.sampled_from(("normal", "constant", "extreme", "tiny", "integers")))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    largest = torch.finfo(dtype).max
    if kind == "normal":
        scale = 10.0 ** draw(st.integers(-6, 6))
        offset = draw(st.sampled_from((0.0, 1.0, -50.0, 1e4)))
        values = torch.randn(size, generator=generator, dtype=torch.float64) * scale + offset
    elif kind == "constant":
        values = torch.full((size,), draw(st.sampled_from((0.0, 1.0, -3.5, 1e-3, 0.05))), dtype=torch.float64)
    elif kind == "extreme":
        values = (torch.rand(size, generator=generator, dtype=torch.float64) * 0.1 + 0.9) * largest
        values *= torch.randint(0, 2, (size,), generator=generator) * 2 - 1
    elif kind == "tiny":
        values = torch.randn(size, generator=generator, dtype=torch.float64) * torch.finfo(dtype).tiny
    else:
        values = torch.randint(-3, 4, (size,), generator=generator).double()
    x = values.to(dtype)
    sprinkle = draw(st.sampled_from((0, 0, 1, 3)))
    if size and sprinkle:
        picks = torch.randint(0, size, (sprinkle,), generator=generator)
        x[picks] = torch.tensor([math.nan, math.inf, -math.inf], dtype=dtype)[torch.arange(sprinkle) % 3]
    return x


def check(statistics: torch.Tensor, wanted: Expected, rtol: float = 1e-9) -> None:
    """Compare finalized statistics with the oracle, relative to the largest finite magnitude."""
    got = dict(zip(STATISTICS, statistics.tolist(), strict=True))
    scale = max(abs(wanted.min), abs(wanted.max)) if wanted.count else 1.0
    assert got["count"] == wanted.count
    assert got["nonfinite"] == wanted.nonfinite
    for name in ("mean", "std", "rms", "min", "max"):
        assert close(got[name], getattr(wanted, name), scale, rtol), (name, got[name], getattr(wanted, name))
    for name in ("near_zero", "saturated"):
        assert close(got[name], getattr(wanted, name), 1.0, 1e-12), (name, got[name], getattr(wanted, name))
    finite = [got[name] for name in ("mean", "std", "rms", "min", "max") if wanted.count]
    assert all(math.isfinite(v) for v in finite), got  # finite inputs give finite statistics


@SETTINGS
@given(x=tensors(), signed=st.booleans(), bounded=st.booleans())
def test_describe_matches_the_oracle(x: torch.Tensor, signed: bool, bounded: bool) -> None:
    bounds = (-1.0, 1.0) if bounded else None
    spec = Spec(near_zero=0.05 if signed else 1e-3, signed=signed, bounds=bounds)
    record = describe(x, spec).record
    check(finalize(record), expected(values_of(x), spec.near_zero, signed, bounds))


@SETTINGS
@given(parts=st.lists(tensors(max_size=60), min_size=1, max_size=6))
def test_combined_parts_equal_the_whole(parts: list[torch.Tensor]) -> None:
    """Records split across steps or ranks and combined (Chan) equal the description of all values at once."""
    spec = Spec()
    record = empty()
    for part in parts:
        record = combine(record, describe(part, spec).record)
    check(finalize(record), expected(values_of(*parts)), rtol=1e-7)


@SETTINGS
@given(parts=st.lists(tensors(max_size=60), min_size=1, max_size=6), groups=st.integers(1, 3))
def test_batched_segments_equal_the_oracle(parts: list[torch.Tensor], groups: int) -> None:
    """Many small tensors described at once: each group (parts i, i + groups, ...) equals the oracle of its values."""
    parts = [p for p in parts if p.dtype != torch.float64]  # float64 tensors take the exact single-tensor path
    if not parts:
        return
    owner = [i % groups for i in range(len(parts))]
    segments = Segments([p.numel() for p in parts], owner, torch.device("cpu"), [(-1.0, 1.0)] * groups)
    values = torch.cat([p.reshape(-1).double() for p in parts])
    table = finalize(describe_segments(values, segments, Spec()))
    for group in range(max(owner) + 1):
        members = [p for p, g in zip(parts, owner, strict=True) if g == group]
        check(table[group], expected(values_of(*members), bounds=(-1.0, 1.0)), rtol=1e-7)


@pytest.mark.parametrize(
    ("sizes", "owner", "numpy"),
    [
        ([5, 1, 300, 17], [0, 1, 2, 3], True),  # each part its own group, none empty: numpy's reduceat
        ([5, 0, 300, 17], [0, 1, 2, 3], False),  # an empty part: torch's segment reductions
        ([5, 1, 300, 17], [0, 1, 0, 1], False),  # groups of several parts: torch's scatter reductions
    ],
)
@pytest.mark.parametrize("nonfinite", [True, False])
@pytest.mark.parametrize("in_buffers", [True, False])
def test_every_way_of_reducing_segments_equals_the_oracle(
    sizes: list[int], owner: list[int], numpy: bool, nonfinite: bool, in_buffers: bool
) -> None:
    """The sums, min and max of segments on the CPU go through numpy where the segments allow it and torch
    otherwise: each way equals the oracle, with values of every sign in the parts, with NaN and inf among them
    and without (numpy's way then skips the passes that set them aside)."""
    generator = torch.Generator().manual_seed(0)
    parts = [torch.randn(size, generator=generator) * 10.0 ** (index - 2) for index, size in enumerate(sizes)]
    if nonfinite:
        parts[2][[3, 40, 41]] = torch.tensor([math.nan, math.inf, -math.inf])
    parts[3][0] = 1e30
    groups = max(owner) + 1
    segments = Segments(sizes, owner, torch.device("cpu"), [(-1.0, 1.0)] * groups)
    assert (segments.starts is not None) == numpy
    values = torch.cat([p.double() for p in parts])
    work = Workspace() if in_buffers else None  # the buffers a flush describes in (temporaries written there)
    table = finalize(describe_segments(values, segments, Spec(), work=work))
    norms = norm_segments(values, segments, work)
    if work is not None:  # the buffers reused: the same again
        again = finalize(describe_segments(values, segments, Spec(), work=work))
        torch.testing.assert_close(again, table, rtol=0, atol=0, equal_nan=True)
    for group in range(groups):
        members = [p for p, g in zip(parts, owner, strict=True) if g == group]
        wanted = expected(values_of(*members), bounds=(-1.0, 1.0))
        check(table[group], wanted)
        assert close(float(norms[group, 0]), wanted.norm, wanted.norm, 1e-9)
        assert float(norms[group, 1]) == wanted.nonfinite


@SETTINGS
@given(x=tensors())
def test_norms_match_the_oracle(x: torch.Tensor) -> None:
    wanted = expected(values_of(x))
    norm, nonfinite, count, sampled = norm_of(x).tolist()
    assert close(norm, wanted.norm, wanted.norm, 1e-9) or (math.isinf(norm) and wanted.norm > 1.7e308)
    assert (nonfinite, count, sampled) == (wanted.nonfinite, x.numel(), 0)


@SETTINGS
@given(parts=st.lists(tensors(max_size=60), min_size=1, max_size=4))
def test_norm_segments_and_combined_norms_match_the_oracle(parts: list[torch.Tensor]) -> None:
    parts = [p for p in parts if p.dtype != torch.float64]
    if not parts:
        return
    segments = Segments([p.numel() for p in parts], list(range(len(parts))), torch.device("cpu"))
    table = norm_segments(torch.cat([p.reshape(-1).double() for p in parts]), segments)
    total = torch.zeros(len(NORM), dtype=torch.float64)
    for row, part in zip(table, parts, strict=True):
        wanted = expected(values_of(part))
        assert close(float(row[0]), wanted.norm, wanted.norm, 1e-9)
        assert float(row[1]) == wanted.nonfinite
        total = combine_norms(total, row)
    everything = expected(values_of(*parts))
    assert close(float(total[0]), everything.norm, everything.norm, 1e-9)


@SETTINGS
@given(x=tensors(), bins=st.sampled_from((2, 8, 40)))
def test_automatic_histogram_matches_the_oracle(x: torch.Tensor, bins: int) -> None:
    described = describe(x, Spec())
    record = described.record
    largest = torch.maximum(record[Column.MIN].abs(), record[Column.MAX].abs())
    exponent = exponent_of(torch.where(record[Column.COUNT] > 0, largest, 0.0))
    hist = histogram_counts(described.values, described.finite, bins, exponent)
    values = values_of(x)
    wanted_exponent = auto_exponent(values)
    if wanted_exponent is None:
        assert int(exponent) == EXPONENT_NONE
        assert hist[: bins // 2].sum() == 0 and hist[bins // 2 + 1 :].sum() == 0
        assert float(hist.sum()) == np.isfinite(values).sum()
        return
    assert int(exponent) == wanted_exponent
    assert hist[:bins].tolist() == auto_histogram(values, bins, wanted_exponent).tolist()
    assert hist[bins:].tolist() == [0.0, 0.0]  # nothing outside an automatic range


@SETTINGS
@given(parts=st.lists(tensors(max_size=80), min_size=2, max_size=5), bins=st.sampled_from((4, 40)))
def test_histograms_of_different_ranges_rebin_exactly(parts: list[torch.Tensor], bins: int) -> None:
    """Histograms of parts with their own ranges, re-binned to the widest and summed, equal one histogram of all."""
    exponents, hists = [], []
    for part in parts:
        described = describe(part, Spec())
        values = described.values[described.finite > 0]
        exponent = exponent_of(values.abs().amax() if values.numel() else torch.tensor(0.0))
        exponents.append(exponent)
        hists.append(histogram_counts(described.values, described.finite, bins, exponent))
    target = torch.stack(exponents).amax()
    total = rebin(torch.stack(hists), torch.stack(exponents), target).sum(0)
    everything = values_of(*parts)
    wanted_exponent = auto_exponent(everything)
    if wanted_exponent is not None:
        assert int(target) == wanted_exponent
        assert total[:bins].tolist() == auto_histogram(everything, bins, wanted_exponent).tolist()


@SETTINGS
@given(x=tensors(), bounds=st.sampled_from(((-1.0, 1.0), (0.0, 0.5), (-1e300, 1e300), (-3.0, -1.0))))
def test_fixed_histogram_counts_what_falls_outside(x: torch.Tensor, bounds: tuple[float, float]) -> None:
    described = describe(x, Spec())
    hist = histogram_counts(described.values, described.finite, 10, None, bounds)
    counts, below, above = fixed_histogram(values_of(x), 10, bounds)
    assert hist[:10].tolist() == counts.tolist()
    assert hist[UNDERFLOW].item() == below and hist[OVERFLOW].item() == above
    edges = fixed_edges(bounds, 10)
    assert torch.isfinite(edges).all() and edges[0] == bounds[0] and edges[-1] == bounds[1]


def test_edges_of_the_largest_exponents_are_finite() -> None:
    x = torch.tensor([1.7e308, -1.0e308, 3.0], dtype=torch.float64)
    described = describe(x, Spec())
    exponent = exponent_of(x.abs().amax())
    assert int(exponent) == 1024
    hist = histogram_counts(described.values, described.finite, 40, exponent)
    assert hist.sum().item() == 3
    assert torch.isfinite(auto_edges(1024, 40)).all()


def test_extreme_bf16_and_float32_values_give_finite_statistics() -> None:
    """The issue's cases: bf16 near 1e38 and float32 at +-3e38, described exactly and from a sample."""
    for x in (torch.full((300_000,), 1e38, dtype=torch.bfloat16), torch.tensor([3e38, -3e38] * 100_000)):
        for described in (describe(x, Spec()), describe_large(x, Spec(), Sampler())):
            values = finalize(described.record)
            assert torch.isfinite(values[:5]).all(), values
            assert values[STATISTICS.index("nonfinite")] == 0


def test_one_nan_does_not_blind_the_statistics() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, math.nan])
    values = dict(zip(STATISTICS, finalize(describe(x, Spec()).record).tolist(), strict=True))
    assert values["mean"] == 2.0 and values["min"] == 1.0 and values["nonfinite"] == 1 and values["count"] == 3
    assert values["std"] == pytest.approx(1.0)


def test_finalized_statistics_turn_back_into_the_records_of_their_values() -> None:
    """`from_statistics` (results saved finalized, merged across ranks) against records written by hand: 6 finite
    values and 2 NaN, a quarter of the 8 estimated from a sample; the same with the sampled share unknown (NaN:
    counted as exact); a module never observed (every statistic NaN) and one that saw 3 NaN only: empty records,
    the second with its non-finite count."""
    finite = np.array([1.0, 2.0, 3.0, 4.0, 6.0, 8.0])
    row = {
        "mean": finite.mean(),
        "std": finite.std(ddof=1),
        "rms": math.sqrt(np.mean(finite**2)),
        "min": 1.0,
        "max": 8.0,
        "near_zero": 1 / 6,
        "nonfinite": 2.0,
        "saturated": 0.5,
        "count": 6.0,
        "sampled": 0.25,
    }
    unknown = dict(row, sampled=math.nan)
    never = dict.fromkeys(STATISTICS, math.nan)
    only_nan = never | {"count": 0.0, "nonfinite": 3.0, "sampled": 1.0}
    table = torch.tensor([[r[name] for name in STATISTICS] for r in (row, unknown, never, only_nan)])
    got = from_statistics(table)
    wanted = [6.0, finite.mean(), finite.std(ddof=0), 1.0, 8.0, 2.0, 1.0, 3.0, 2.0]  # the RECORD columns
    assert got[0].tolist() == pytest.approx(wanted, rel=1e-12)
    assert got[1].tolist() == pytest.approx([*wanted[:-1], 0.0], rel=1e-12)
    assert got[2].tolist() == [0.0, 0.0, 0.0, math.inf, -math.inf, 0.0, 0.0, 0.0, 0.0]
    assert got[3].tolist() == [0.0, 0.0, 0.0, math.inf, -math.inf, 3.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "bounds", [(0.0,), (0.0, 1.0, 2.0), (1.0, 1.0), (2.0, 1.0), (0.0, math.inf), (math.nan, 1.0), ("0", 1.0), 5.0]
)
def test_a_fixed_histogram_range_must_be_two_finite_increasing_numbers(bounds: object) -> None:
    with pytest.raises(ValueError, match=r"^hist_range must be a pair \(low, high\) of finite numbers with low < high"):
        check_range("hist_range", bounds)


def test_a_fixed_histogram_range_is_read_as_two_floats() -> None:
    for bounds, wanted in (((0, 1), (0.0, 1.0)), ([-2.5, 3], (-2.5, 3.0)), ((-1e300, 1e300), (-1e300, 1e300))):
        got = check_range("hist_range", bounds)
        assert got == wanted and all(type(b) is float for b in got)
    assert check_range("hist_range", None) is None


def test_the_smallest_subnormal_values_are_described() -> None:
    """float64 values of at most 2**-1074 in magnitude: scaled by a power of two that is itself representable."""
    x = torch.tensor([5e-324, -5e-324, 5e-324, 0.0], dtype=torch.float64)
    got = dict(zip(STATISTICS, finalize(describe(x, Spec()).record).tolist(), strict=True))
    assert got["min"] == -5e-324 and got["max"] == 5e-324 and got["count"] == 4
    assert all(math.isfinite(got[name]) for name in ("mean", "std", "rms"))
    check(finalize(describe(x, Spec()).record), expected(values_of(x)))


def test_automatic_edges_span_their_power_of_two_and_give_back_its_exponent() -> None:
    for exponent in (-1021, -3, 0, 5, 1023):
        edges = auto_edges(exponent, 8)
        assert edges.tolist() == (np.linspace(-1.0, 1.0, 9) * 2.0**exponent).tolist()
        assert exponent_of_edges(edges) == exponent
    assert auto_edges(EXPONENT_NONE, 8).tolist() == np.linspace(-1.0, 1.0, 9).tolist()  # radius 1
    largest = auto_edges(1024, 8)  # 2**1024 is beyond float64: its end edges are shown as the largest float
    assert largest[-1] == torch.finfo(torch.float64).max and exponent_of_edges(largest) == 1024
    assert exponent_of_edges(fixed_edges((0.0, 3.0), 4)) == EXPONENT_NONE  # not a power of two


def test_a_histogram_without_a_range_or_exponent_counts_over_zero_to_one() -> None:
    """The kernels' default fixed range is [0, 1] (values outside counted below and above it)."""
    values = torch.tensor([-0.5, 0.0, 0.3, 0.99, 1.0, 1.5, 2.5], dtype=torch.float64)
    finite = torch.ones_like(values)
    wanted, below, above = fixed_histogram(values.numpy(), 4, (0.0, 1.0))
    assert histogram_counts(values, finite, 4).tolist() == [*wanted, below, above]
    one_group = torch.zeros(values.numel(), dtype=torch.int64)
    assert segment_counts(values, finite, one_group, 1, 4)[0].tolist() == [*wanted, below, above]
    assert row_counts(values.float()[None], finite.float()[None], 4)[0].tolist() == [*wanted, below, above]


@pytest.mark.parametrize("near_zero", [1e-3, 0.05, 0.5, 0.0, 2.0**-30, 1e-40])
def test_the_float32_near_zero_threshold_is_the_largest_float32_at_most_it(near_zero: float) -> None:
    threshold = Spec(near_zero=near_zero).near_zero32
    assert np.float32(threshold) == threshold <= near_zero
    assert float(np.nextafter(np.float32(threshold), np.float32(np.inf))) > near_zero


def test_accumulation_dtypes() -> None:
    cpu, mps = torch.device("cpu"), torch.device("mps")
    assert (wide_dtype(cpu), wide_dtype(mps)) == (torch.float64, torch.float32)  # no float64 on MPS
    wanted = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float32}
    wanted |= {torch.float64: torch.float64, torch.int64: torch.float64, torch.uint8: torch.float64}
    assert {dtype: accumulate_dtype(dtype, cpu) for dtype in wanted} == wanted
    assert accumulate_dtype(torch.int64, mps) == torch.float32
    with pytest.raises(TypeError, match=r"must be real, got dtype torch.complex64; push x.abs\(\)"):
        accumulate_dtype(torch.complex64, cpu)


@pytest.mark.parametrize(
    ("sizes", "owner"),
    [([5, 1, 300, 17], [0, 1, 2, 3]), ([5, 0, 3], [0, 1, 2]), ([4, 2, 6], [0, 1, 0])],  # repeat, gather, gather
)
def test_spreading_a_value_per_group_over_its_values_equals_gathering_by_segment(
    sizes: list[int], owner: list[int]
) -> None:
    """`Segments.spread` (numpy's repeat over contiguous segments, else a gather) gives each value its group's."""
    segments = Segments(sizes, owner, torch.device("cpu"))
    per_group = torch.tensor([0.5, -2.0, math.inf, 7.0][: segments.groups], dtype=torch.float64)
    wanted = torch.tensor([float(per_group[g]) for g, size in zip(owner, sizes, strict=True) for _ in range(size)])
    assert torch.equal(segments.spread(per_group), wanted.double())
    assert torch.equal(segments.spread(per_group, torch.empty(sum(sizes), dtype=torch.float64)), wanted.double())


def test_a_workspace_keeps_each_flat_buffer_at_the_largest_size_asked_for() -> None:
    work = Workspace()
    first = work.flat("values", 100, torch.float64, torch.device("cpu"))
    smaller = work.flat("values", 40, torch.float64, torch.device("cpu"))
    assert first.shape == (100,) and smaller.shape == (40,)
    assert smaller.data_ptr() == first.data_ptr()  # reused, not made again
    larger = work.flat("values", 300, torch.float64, torch.device("cpu"))
    assert larger.shape == (300,) and work.flat("values", 100, torch.float64, torch.device("cpu")).data_ptr() == (
        larger.data_ptr()
    )
    other = work.flat("values", 100, torch.float32, torch.device("cpu"))  # another dtype: a buffer of its own
    assert other.dtype == torch.float32 and other.data_ptr() != larger.data_ptr()
    assert work.flat("scratch", 100, torch.float64, torch.device("cpu")).data_ptr() != larger.data_ptr()


def test_segment_histograms_spread_by_segments_equal_those_gathered() -> None:
    generator = torch.Generator().manual_seed(1)
    sizes = [30, 1, 200]
    segments = Segments(sizes, [0, 1, 2], torch.device("cpu"))
    values = torch.cat([torch.randn(size, generator=generator).double() * 10.0**k for k, size in enumerate(sizes)])
    values[[3, 50]] = torch.tensor([math.nan, -math.inf], dtype=torch.float64)
    finite = torch.isfinite(values).double()
    exponents = torch.tensor([2, -1, 5])
    gathered = segment_counts(values, finite, segments.segment, 3, 8, exponents)
    spread = segment_counts(values, finite, segments.segment, 3, 8, exponents, spread=segments.spread)
    work = Workspace()
    for _ in range(2):  # in a workspace's buffers, made and then reused
        in_buffers = segment_counts(values, finite, segments.segment, 3, 8, exponents, segments.spread, work=work)
        assert torch.equal(in_buffers, spread)
    assert torch.equal(gathered, spread)
    for group, (start, size) in enumerate(zip(np.cumsum([0, *sizes[:-1]]), sizes, strict=True)):
        part = values[start : start + size]
        wanted = histogram_counts(part, torch.isfinite(part).double(), 8, exponents[group])
        assert torch.equal(spread[group], wanted)
