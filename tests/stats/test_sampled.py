"""Large tensors described from a sample: exact where promised, within the bounds elsewhere, on adversarial layouts.

Bounds (the issue's): relative error of std <= 2 %, near-zero fraction and each histogram bin's share of the mass
within 0.01 absolute. Where the values themselves are random (a ReLU's zeros, half the values zero at random, an
outlier feature's Gaussian values), a fraction p estimated from a sample of n values has a standard error of
sqrt(p (1 - p) / n): 0.0055 at p = 0.5 and n = 8192, so 0.01 is under two standard errors there and no sample of that
size can promise it. Each fraction is held to the larger of 0.01 and three standard errors of its true value.
Exact: count, mean, min, max and whether a value is non-finite. Each layout is checked on several independent samples
(fresh random starts), against the oracle of the whole tensor.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hookscope.stats import _histogram as histogram
from hookscope.stats._describe import (
    CACHED_EXTREMES,
    describe,
    describe_large,
    sample_alone,
    sample_values,
    take_sample,
)
from hookscope.stats._histogram import counts as histogram_counts
from hookscope.stats._histogram import exponent_of, row_counts
from hookscope.stats._norms import norm_of
from hookscope.stats._record import STATISTICS, finalize
from hookscope.stats._sample import SAMPLE_SIZE, Sampler, period_for
from hookscope.stats._spec import Spec
from hookscope.stats._tables import NormTable, RecordTable
from stats_oracle import auto_exponent, auto_histogram, auto_shares, expected, fixed_histogram, values_of


def _nchw_offsets() -> torch.Tensor:
    x = torch.randn(16, 64, 24, 24)
    return x + torch.linspace(-20, 20, 64).view(1, 64, 1, 1)


def _one_hot_channel() -> torch.Tensor:
    x = torch.randn(16, 64, 24, 24).relu()
    x[:, 37] += 50.0
    return x


def _sparse() -> torch.Tensor:
    x = torch.randn(64, 4096)
    return torch.where(torch.rand(64, 4096) < 0.05, x, torch.zeros(()))


def _transformer() -> torch.Tensor:
    x = torch.randn(8, 128, 768) * 0.5
    x[..., 100] *= 40.0  # an outlier feature, as in large language models
    return x


def _hard_sparse() -> torch.Tensor:
    """Half the values exactly zero, at random: the near-zero estimate's worst case (a fraction of 0.5)."""
    x = torch.randn(512, 1024)
    return torch.where(torch.rand(512, 1024) < 0.5, x, torch.zeros(()))


LAYOUTS = {
    "nchw_offsets": _nchw_offsets,
    "one_hot_channel": _one_hot_channel,
    "sparse": _sparse,
    "transformer_outlier": _transformer,
    "half_zero": _hard_sparse,
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampled_statistics_are_within_the_bounds(layout: str, dtype: torch.dtype) -> None:
    x = LAYOUTS[layout]().to(dtype)
    values = values_of(x)
    wanted = expected(values)
    bins = 40
    exponent = auto_exponent(values)
    assert exponent is not None
    truth = auto_shares(values, bins, exponent)
    sampler = Sampler(seed=1)
    for _ in range(5):
        described = describe_large(x, Spec(), sampler)
        got = dict(zip(STATISTICS, finalize(described.record).tolist(), strict=True))
        n = described.values.numel()  # the sample's size
        assert got["sampled"] == 1.0
        assert got["count"] == wanted.count and got["nonfinite"] == 0
        assert got["min"] == wanted.min and got["max"] == wanted.max
        assert got["mean"] == pytest.approx(wanted.mean, rel=1e-5, abs=1e-6 * wanted.std)
        assert got["std"] == pytest.approx(wanted.std, rel=0.02)
        assert abs(got["near_zero"] - wanted.near_zero) <= _bound(np.array(wanted.near_zero), n)
        largest = max(abs(got["min"]), abs(got["max"]))
        hist = histogram_counts(described.values, described.finite, bins, exponent_of(torch.tensor(largest)))
        share = hist[:bins].numpy() / float(hist[:bins].sum())
        assert (np.abs(share - truth) <= _bound(truth, n)).all()


def _bound(fraction: np.ndarray, n: int) -> np.ndarray:
    """The issue's 0.01, or three standard errors of a fraction estimated from n values where that is larger."""
    return np.maximum(0.01, 3.0 * np.sqrt(fraction * (1.0 - fraction) / n))


def test_sampled_unit_activity_follows_each_unit() -> None:
    """Dead units are exactly 0 and always-active ones exactly 1 (each sampled value counts in both the active and
    the seen values of its unit); the others, from about 126 sampled values each in one step, within 3 standard
    errors of a fraction of 0.5 (they converge over steps: tests/watch/test_watch_perf_paths.py)."""
    x = torch.randn(16, 64, 24, 24)
    x[:, :8] = -1.0  # eight dead channels
    x[:, 8:16] = torch.rand(16, 8, 24, 24) + 0.1  # eight always active
    truth = (x > 0).double().mean(dim=(0, 2, 3))
    table = RecordTable(1, Spec(), sampler=Sampler(seed=3), unit_dim=lambda key, ndim: 1)
    table.allocate(1, torch.device("cpu"))
    table.add(0, 0, x)
    activity = table.unit_activity()[0]
    assert activity is not None
    assert (activity[:8] == 0).all() and (activity[8:16] == 1).all()
    assert (activity - truth).abs().max() <= 3 * 0.5 / math.sqrt(126)


def test_non_finite_values_in_a_sampled_tensor_are_found_and_do_not_blind_it() -> None:
    x = torch.randn(400_000)
    x[123_457] = math.nan
    x[7] = math.inf
    got = dict(
        zip(
            STATISTICS,
            finalize(describe_large(x, Spec(), Sampler()).record).tolist(),
            strict=True,
        )
    )
    wanted = expected(values_of(x))
    assert got["nonfinite"] >= 1  # present: always reported, even when the sample misses both values
    assert math.isfinite(got["mean"]) and got["mean"] == pytest.approx(wanted.mean, abs=0.02)
    assert got["std"] == pytest.approx(wanted.std, rel=0.02)
    # With a non-finite value present the extremes come from the sample: inside the finite range, and beyond the
    # 0.1 % quantiles (a sample of 8192 misses the 400 most extreme values on a side with probability 3e-4).
    low, high = np.quantile(values_of(x)[np.isfinite(values_of(x))], [0.001, 0.999])
    assert wanted.min <= got["min"] <= low and high <= got["max"] <= wanted.max


def test_exact_describe_large_without_a_sampler_is_the_reference() -> None:
    x = _one_hot_channel()
    sampled_path = describe_large(x, Spec(), None).record
    assert torch.equal(sampled_path.nan_to_num(), describe(x, Spec()).record.nan_to_num())


def test_the_sample_visits_every_channel_in_proportion_and_never_repeats() -> None:
    """In one NCHW tensor (each channel a contiguous block) every channel gets its share of the sample, +-1."""
    shape = (1, 64, 96, 96)
    n = math.prod(shape)
    sampler = Sampler(seed=0)
    for _ in range(3):
        padded, count = sampler.index(n, torch.device("cpu"))
        assert padded.numel() == SAMPLE_SIZE  # every sample has the same width: its rows stack
        index = padded[:count]
        assert index.unique().numel() == index.numel()
        assert 0.9 * SAMPLE_SIZE <= index.numel() <= SAMPLE_SIZE
        assert int(index.min()) >= 0 and int(index.max()) < n
        channels = torch.bincount(index // (96 * 96), minlength=64)
        assert int(channels.max() - channels.min()) <= 2  # +-1 around the share, the random start included


def test_sampling_leaves_the_users_random_stream_alone() -> None:
    torch.manual_seed(5)
    expected_draw = torch.rand(3)
    torch.manual_seed(5)
    describe_large(torch.randn(300_000), Spec(), Sampler())
    assert not torch.equal(torch.rand(3), expected_draw)  # randn above consumed the stream ...
    torch.manual_seed(5)
    x = torch.randn(300_000)
    after_input = torch.get_rng_state()
    describe_large(x, Spec(), Sampler())
    assert torch.equal(torch.get_rng_state(), after_input)  # ... the sampler did not


def _norm_cases(nan_share: float) -> list[torch.Tensor]:
    """Large tensors whose norm is estimated from a sample: `nan_share` of the values NaN, and values whose float32
    sum of squares overflows (no non-finite value)."""
    with_nan = torch.randn(300_000)
    with_nan[torch.rand(300_000) < nan_share] = math.nan
    return [with_nan, torch.randn(200_000) * 1e20]


def _check_norm(record: list[float], x: torch.Tensor) -> None:
    """A sampled norm record against the oracle: the norm of the finite values within 5 % (a sum of squares of
    8192 normal values has a standard error of 1.6 %), the non-finite count within 40 % (about 80 NaN sampled: a
    standard error of 11 %), the count exact."""
    norm, nonfinite, count, _ = record
    wanted = expected(values_of(x))
    assert norm == pytest.approx(wanted.norm, rel=0.05)
    assert nonfinite == pytest.approx(wanted.nonfinite, rel=0.4, abs=0.0)
    assert count == x.numel()


def test_norms_estimated_from_a_sample_match_the_oracle() -> None:
    for x in _norm_cases(0.01):
        _check_norm(norm_of(x, Sampler(seed=2)).tolist(), x)


def test_norm_table_cells_of_sampled_tensors_match_the_oracle() -> None:
    cases = _norm_cases(0.01)
    table = NormTable(len(cases), Sampler(seed=2))
    table.allocate(1, torch.device("cpu"))
    for key, x in enumerate(cases):
        table.add(0, key, x)
    table.flush()
    assert table.norms is not None
    for key, x in enumerate(cases):
        _check_norm(table.norms[0, key].tolist(), x)


@pytest.mark.parametrize("count_nonfinite", [True, False])
def test_a_large_tensor_of_finite_values_has_its_exact_norm_on_the_cpu(count_nonfinite: bool) -> None:
    """On the CPU a finite float32 sum of squares says every value is finite: the norm is its root (float32
    accumulation: within 1e-5 of the float64 oracle), nothing counted non-finite, nothing sampled; contiguous
    float32, float16 and a transposed tensor alike."""
    cases = [torch.randn(300_000) * 3, torch.randn(40_000).half(), torch.randn(500, 400).t()]
    table = NormTable(len(cases), Sampler(seed=2), count_nonfinite=count_nonfinite)
    table.allocate(1, torch.device("cpu"))
    for key, x in enumerate(cases):
        table.add(0, key, x)
    assert table.pending_values == 0  # nothing waits: no sample was taken
    table.flush()
    assert table.norms is not None
    for key, x in enumerate(cases):
        norm, nonfinite, count, sampled = table.norms[0, key].tolist()
        assert norm == pytest.approx(expected(values_of(x)).norm, rel=1e-5)
        assert (nonfinite, count, sampled) == (0.0, x.numel(), 0.0)


def test_the_norm_of_a_tensor_read_only_as_a_sample_matches_the_oracle() -> None:
    """`sample_alone` (what `watch()` reads of a large weight's change: the same positions before and after the
    step): the norm within `_check_norm`'s bounds, the count exact, every value counted as estimated. Nothing but
    the sample is read: a NaN where the sample looks is counted (about 80 sampled of 3,000 here), one where it
    does not look is not."""
    sampler = Sampler(seed=2)
    unseen = torch.randn(300_000)
    cases = [*_norm_cases(0.01), unseen]
    table = NormTable(len(cases), sampler)
    table.allocate(1, torch.device("cpu"))
    for key, x in enumerate(cases):
        comb, count, slack = sampler.positions(x.numel(), x.device)
        start = sampler.draw(slack)
        if x is unseen:  # a NaN at the first position the sample skips
            looked = set((comb[:count] + start).tolist())
            unseen[next(i for i in range(x.numel()) if i not in looked)] = math.nan
        table.add_sample(0, key, sample_alone(sample_values(x, comb, start), comb, start, x.numel(), count))
    table.flush()
    assert table.norms is not None
    for key, x in enumerate(cases[:2]):
        _check_norm(table.norms[0, key].tolist(), x)
        assert float(table.norms[0, key, 3]) == x.numel()  # sampled: all of them
    norm, nonfinite, count, sampled = table.norms[0, 2].tolist()
    assert norm == pytest.approx(expected(values_of(unseen)).norm, rel=0.05)
    assert (nonfinite, count, sampled) == (0.0, unseen.numel(), unseen.numel())


def test_the_sampled_norm_of_a_tensor_with_many_nan_is_the_norm_of_its_finite_values() -> None:
    """NORM's norm is that of the finite values (the exact path's): a sampled NaN stands for values that add
    nothing to it (scaling the sample's norm by the finite values it kept instead is 5 % too high here)."""
    x = _norm_cases(0.1)[0]
    norm = float(norm_of(x, Sampler(seed=2))[0])
    assert norm == pytest.approx(expected(values_of(x)).norm, rel=0.03)


@pytest.mark.parametrize("float32_codes", [True, False])
def test_row_histograms_of_samples_match_the_oracle(float32_codes: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """`row_counts` (the histograms of sampled tensors, one row each) against the oracle row by row: rows of their
    own ranges (or a fixed one, counting what falls outside), non-finite values and padding left out; the rows'
    columns found in float32 (every code exact in it) or, past `EXACT_CODES`, in int64."""
    if not float32_codes:
        monkeypatch.setattr(histogram, "EXACT_CODES", 3 * 11 - 1)  # 3 rows of 8 + 3 columns: the last code is past it
    values = torch.randn(3, 50) * torch.tensor([[1e-3], [1.0], [300.0]])
    values[0, :3] = torch.tensor([math.nan, math.inf, -math.inf])
    finite = torch.isfinite(values).float()
    finite[2, -5:] = 0.0  # padding: not part of the sample
    kept = [values[row][finite[row] > 0].double().numpy() for row in range(3)]
    bins, bounds = 8, (-1.0, 1.0)
    exponents = [auto_exponent(v) for v in kept]
    automatic = row_counts(values, finite, bins, torch.tensor(exponents))
    fixed = row_counts(values, finite, bins, None, bounds)
    for row, wanted in enumerate(kept):
        assert automatic[row].tolist() == [*auto_histogram(wanted, bins, exponents[row]), 0.0, 0.0]
        counts, below, above = fixed_histogram(wanted, bins, bounds)
        assert fixed[row].tolist() == [*counts, below, above]


@pytest.mark.parametrize("bounds", [(0.0, 1.0), (-1.0, 1.0)])
def test_the_saturated_share_of_a_sampled_tensor_is_within_the_bounds(bounds: tuple[float, float]) -> None:
    """A sigmoid's and a tanh's outputs (a quarter of them within 1 % of the range from a bound), from a sample."""
    z = torch.randn(64, 4096) * 4.0
    x = torch.sigmoid(z) if bounds == (0.0, 1.0) else torch.tanh(z / 2)
    wanted = expected(values_of(x), bounds=bounds)
    described = describe_large(x, Spec(bounds=bounds), Sampler(seed=4))
    got = dict(zip(STATISTICS, finalize(described.record).tolist(), strict=True))
    assert 0.1 < wanted.saturated < 0.5
    assert abs(got["saturated"] - wanted.saturated) <= _bound(np.array(wanted.saturated), described.values.numel())


def test_the_count_of_a_sampled_tensor_with_many_nan_leaves_them_out() -> None:
    """A tenth of the values NaN: the count of finite values and the non-finite count are estimated (within 4
    standard errors of a share of 0.1 in 8192 values) and add up to the number of values."""
    x = _norm_cases(0.1)[0]
    wanted = expected(values_of(x))
    record = describe_large(x, Spec(), Sampler()).record
    got = dict(zip(STATISTICS, finalize(record).tolist(), strict=True))
    assert got["count"] + got["nonfinite"] == x.numel()
    assert got["count"] == pytest.approx(wanted.count, abs=4 * x.numel() * math.sqrt(0.09 / 8192))


def _primes_from(first: int, count: int) -> list[int]:
    found: list[int] = []
    candidate = first
    while len(found) < count and candidate <= 3 * first:
        if candidate > 1 and all(candidate % p for p in range(2, int(candidate**0.5) + 1)):
            found.append(candidate)
        candidate += 1
    return found


@pytest.mark.parametrize("n", [8192, 16_384, 94_235, 106_644, 1_000_003, 5 * 2**20])
def test_the_sample_period_gives_the_largest_sample_among_its_candidates(n: int) -> None:
    """`period_for` against its definition, by brute force: of the first 64 primes from max(11, n / size) to three
    times that, the one whose evenly spread offsets give the most values without exceeding `size`."""
    size = SAMPLE_SIZE
    candidates = _primes_from(max(11, math.ceil(n / size)), 64)
    best = max((n // p) * min(p, size * p // n) for p in candidates)
    period, offsets = period_for(n, size)
    assert period in candidates and (n // period) * len(offsets) == best <= size
    assert offsets == sorted(set(offsets)) and all(0 <= o < period for o in offsets)


@pytest.mark.parametrize("size", [CACHED_EXTREMES, CACHED_EXTREMES + 1])  # read in two passes, then in one
@pytest.mark.parametrize("special", [None, math.inf, -math.inf, math.nan])
def test_the_exact_readings_of_a_sample_are_the_sum_squares_min_and_max_of_every_value(
    size: int, special: float | None
) -> None:
    x = torch.randn(size, generator=torch.Generator().manual_seed(size)) * 3.0
    if special is not None:
        x[size // 3] = special
    values = x.double().numpy()
    sample = take_sample(x, Sampler())
    total, squares, smallest, largest = (float(reading) for reading in sample.raw)
    if special is not None and math.isnan(special):
        assert math.isnan(smallest) and math.isnan(largest)
    else:
        assert (smallest, largest) == (float(values.min()), float(values.max()))
    assert np.isclose(total, values.sum(), rtol=1e-5, atol=1e-2) or math.isnan(values.sum())
    assert np.isclose(squares, np.square(values).sum(), rtol=1e-5) or not math.isfinite(np.square(values).sum())
