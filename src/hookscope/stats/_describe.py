"""Describe one tensor: its moments record, exactly, or from its exact sums and a sample.

`describe(x, spec)` is the definition every other path is tested against: every value in float64 (float64
inputs are first scaled by a power of two, so that no square overflows), non-finite values counted apart. It
reads the tensor about eight times, which a large activation cannot afford every step. `take_sample` reads it
four times instead: its sum, sum of squares and min/max, exactly, and a sample of about `SAMPLE_SIZE` values
(`_sample.py`); `estimate` turns those, with the sample's own record, into the tensor's record, for many tensors
at once (the tables describe every sample waiting in one batched pass). `describe_large` is the two together for
one tensor. Both return a `Described`: the record and the values the histogram and the unit activity are counted
from (all values, or the sample with the weight each sampled value stands for).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._record import RECORD, Column, empty
from ._rows import Rows, describe_rows
from ._sample import Sampler
from ._spec import Spec, wide_dtype

__all__ = [
    "Described",
    "Sample",
    "describe",
    "describe_large",
    "estimate",
    "sample_alone",
    "sample_values",
    "sum_of_squares",
    "take_sample",
]

RAW = ("sum", "squares", "min", "max")
"""What `take_sample` reads exactly from every value (float32 accumulation)."""


@dataclass
class Described:
    """A tensor's record and the values its histogram and unit activity are counted from.

    Attributes:
        record: (len(RECORD),) float64 on the tensor's device.
        values: Float64 values: every value of the tensor (flat, row-major), or the sample.
        finite: 1.0 where `values` is finite, else 0.0 (same shape).
        weight: 0-d tensor, how many of the tensor's values each finite entry of `values` stands for (1 when
            every value was described).
        index: The flat (row-major) positions of the sample in the tensor; `None` when `values` holds them all.
    """

    record: torch.Tensor
    values: torch.Tensor
    finite: torch.Tensor
    weight: torch.Tensor
    index: torch.Tensor | None = None


def describe(x: torch.Tensor, spec: Spec) -> Described:
    """Describe every value of `x` exactly (the reference definition of every statistic).

    Raises:
        TypeError: `x` is not a real floating-point or integer tensor.
    """
    _check_real(x)
    values = x.detach().reshape(-1).to(wide_dtype(x.device))
    finite = torch.isfinite(values).to(values.dtype)
    if values.numel() == 0:
        record = empty(saturating=spec.bounds is not None, device=x.device)
        return Described(record, values, finite, torch.ones((), dtype=values.dtype, device=x.device))
    clean = torch.where(finite > 0, values, 0.0)
    count = finite.sum()
    safe = count.clamp(min=1)
    unit = _unit(clean) if x.dtype == values.dtype else torch.ones((), dtype=values.dtype, device=x.device)
    scaled = clean / unit
    mean = scaled.sum() / safe
    deviation = ((scaled - mean) * finite).square().sum().div(safe).sqrt()
    inf = math.inf
    columns = {
        Column.COUNT: count,
        Column.MEAN: mean * unit,
        Column.DEVIATION: deviation * unit,
        Column.MIN: torch.where(finite > 0, values, inf).amin(),
        Column.MAX: torch.where(finite > 0, values, -inf).amax(),
        Column.NONFINITE: values.numel() - count,
        Column.NEAR_ZERO: (spec.near(clean) * finite).sum(),
        Column.SATURATED: (spec.saturated(clean) * finite).sum(),
        Column.SAMPLED: torch.zeros_like(count),
    }
    record = torch.stack([columns[k].to(values.dtype) for k in range(len(RECORD))]).double()
    return Described(record, values, finite, torch.ones((), dtype=values.dtype, device=x.device))


@dataclass
class Sample:
    """What `take_sample` keeps of a large tensor.

    Attributes:
        raw: The exact sum, sum of squares, min and max of every value (`RAW`), 0-d float32 tensors.
        values: The sampled values, float32, `(sampler.size,)`: the sample, then padding (copies of its first).
        comb: The sample's positions before the start (`Sampler.positions`), shared by every sample of the size.
        start: The random start: the sample's flat (row-major) positions are `comb + start`.
        numel: The number of values of the tensor.
        count: How many of `values` are the sample (the rest is padding, not part of it).
    """

    raw: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    values: torch.Tensor
    comb: torch.Tensor
    start: int
    numel: int
    count: int

    @property
    def index(self) -> torch.Tensor:
        """The flat positions of `values` in the tensor."""
        return self.comb + self.start


def sum_of_squares(x: torch.Tensor) -> torch.Tensor:
    """The sum of the squares of every value of `x` (a 16/32-bit float tensor) in float32 accumulation: one pass,
    0-d float32, no sync. It is not finite when a value is not, or when the sum overflows float32."""
    x = x.detach()
    if x.dtype == torch.float32 and x.is_contiguous():
        flat = x.reshape(-1)
        return torch.dot(flat, flat)  # BLAS: the fastest pass
    squares: torch.Tensor = torch.linalg.vector_norm(x, dtype=torch.float32).square()
    return squares


def take_sample(
    x: torch.Tensor,
    sampler: Sampler,
    *,
    with_sum: bool = True,
    with_extremes: bool = True,
    squares: torch.Tensor | None = None,
) -> Sample:
    """Read `x` (a 16/32-bit float tensor of at least `sampler.size` values) four times: its sum (unless not
    `with_sum`: the norms need none), sum of squares (`sum_of_squares`, unless given as `squares`) and min/max
    (unless not `with_extremes`: a norm alone needs none; the sum of squares stands in for them, so a non-finite
    one still says a value may not be finite) in float32 accumulation, and a sample. A few calls, no sync."""
    x = x.detach()
    squares = sum_of_squares(x) if squares is None else squares
    total = x.sum(dtype=torch.float32) if with_sum else squares  # (a placeholder the norms never read)
    smallest, largest = _extremes(x) if with_extremes else (squares, squares)
    comb, count, start = sampler.draw_positions(x.numel(), x.device)
    raw = (total, squares, smallest, largest)
    return Sample(raw, sample_values(x, comb, start), comb, start, x.numel(), count)


def sample_values(x: torch.Tensor, comb: torch.Tensor, start: int) -> torch.Tensor:
    """The values of `x` at the flat (row-major) positions `comb + start` (`Sampler.positions`, `Sampler.draw`),
    as a new float32 tensor."""
    x = x.detach()
    values = x.reshape(-1)[start:].index_select(0, comb) if x.is_contiguous() else torch.take(x, comb + start)
    return values if values.dtype == torch.float32 else values.float()


def sample_alone(values: torch.Tensor, comb: torch.Tensor, start: int, numel: int, count: int) -> Sample:
    """A `Sample` of a tensor nobody read whole: `values` (float32, `Sampler` padded) are all there is of it, so
    its norm is estimated from them (`estimate_norms`). The change of a large weight in an optimizer step is
    such a tensor: read at the same positions before and after the step, it costs two gathers instead of a copy
    of the weight and three passes over it.

    Its readings say no more than the sample does: the sums of squares are NaN (none was read), and the extremes
    are 0 when every sampled value is finite and NaN when one is not (`x * 0` is NaN for inf and NaN), so that a
    change that is not finite where it was sampled is counted as such, and one that is nowhere it was sampled
    is not."""
    flag = values[:count].mul(0.0).sum()
    unread = torch.full_like(flag, math.nan)
    return Sample((unread, unread, flag, flag), values, comb, start, numel, count)


CACHED_EXTREMES = 1 << 19
"""Values (2 MiB of float32) up to which a CPU tensor's min and max are read as two passes (the second from the
cache): faster there than torch's one-pass `aminmax`, which wins on larger tensors and on accelerators."""


def _extremes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The min and max of `x` (NaN if one is NaN), in the fastest of torch's ways for its size and device."""
    if x.device.type == "cpu" and x.numel() <= CACHED_EXTREMES:
        return x.amin(), x.amax()
    smallest, largest = torch.aminmax(x)
    return smallest, largest


def estimate(raw: torch.Tensor, numel: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """The records (G, len(RECORD)) of G tensors from their exact `raw` readings (G, len(RAW)), their numbers of
    values (G,) and their samples' records (G, len(RECORD)).

    Exact: the count, whether a value is non-finite, the mean and the deviation from the sums unless a value is
    non-finite or a float32 sum overflows (and the deviation while |mean| <= 4 deviations: beyond, the rounding of
    the sum of squares would cancel, and the sample's spread around the exact mean is used), the min and max
    unless one is ±inf or NaN. Estimated from the sample: the near-zero and saturated counts, the non-finite count
    (at least 1 when there is one) and whatever falls back to it.
    """
    raw, n = raw.double(), numel.double()
    total, squares, smallest, largest = raw.unbind(-1)
    kept = sampled[..., Column.COUNT]
    seen = (kept + sampled[..., Column.NONFINITE]).clamp(min=1)
    present = ~(torch.isfinite(smallest) & torch.isfinite(largest))
    nonfinite = torch.where(present, (sampled[..., Column.NONFINITE] * n / seen).clamp(min=1.0), 0.0)
    count = n - nonfinite
    exact = torch.isfinite(total) & torch.isfinite(squares) & ~present
    sample_mean = sampled[..., Column.MEAN]
    mean = torch.where(exact, total / n, sample_mean)
    one_pass = (squares / n - mean.square()).clamp(min=0)
    around = sampled[..., Column.DEVIATION].square() + (sample_mean - mean).square()  # the sample's, about `mean`
    deviation = torch.where(exact & (mean.square() <= 16 * one_pass), one_pass, around).sqrt()
    weight = count / kept.clamp(min=1)
    columns = {
        Column.COUNT: count,
        Column.MEAN: mean,
        Column.DEVIATION: deviation,
        Column.MIN: torch.where(torch.isfinite(smallest), smallest, sampled[..., Column.MIN]),
        Column.MAX: torch.where(torch.isfinite(largest), largest, sampled[..., Column.MAX]),
        Column.NONFINITE: nonfinite,
        Column.NEAR_ZERO: sampled[..., Column.NEAR_ZERO] * weight,
        Column.SATURATED: sampled[..., Column.SATURATED] * weight,
        Column.SAMPLED: n,
    }
    return torch.stack([columns[k] for k in range(len(RECORD))], dim=-1)


def describe_large(x: torch.Tensor, spec: Spec, sampler: Sampler | None) -> Described:
    """Describe `x`: exactly (`describe`) without a `sampler`, for float64 and integer tensors and for tensors
    of fewer than `sampler.size` values; otherwise from its exact sums and a sample (`take_sample`, `estimate`).
    """
    _check_real(x)
    if sampler is None or x.numel() < max(sampler.size, 11) or x.dtype == torch.float64 or not x.is_floating_point():
        return describe(x, spec)
    sample = take_sample(x, sampler)
    rows = Rows(sample.values[: sample.count][None], torch.ones_like(sample.values[: sample.count])[None])
    values = sample.values[: sample.count].double()
    bounds = spec.bounds
    saturation = None
    if bounds is not None:
        middle, half = (bounds[0] + bounds[1]) / 2, 0.49 * (bounds[1] - bounds[0])
        saturation = (torch.full((1,), middle, device=x.device), torch.full((1,), half, device=x.device))
    sampled = describe_rows(rows, spec, saturation)
    raw = torch.stack(sample.raw).float()[None]
    record = estimate(raw, x.new_full((1,), float(sample.numel), dtype=torch.float64), sampled)[0]  # no host copy
    finite = torch.isfinite(values).double()
    weight = record[Column.COUNT] / sampled[0, Column.COUNT].clamp(min=1)
    return Described(record, values, finite, weight, sample.index[: sample.count])


def _unit(clean: torch.Tensor) -> torch.Tensor:
    """The power of two in (largest / 2, largest] of the magnitudes of `clean` (1 when all are 0): dividing by it
    is exact and leaves every value below 2 in magnitude, so no square or sum of squares overflows."""
    largest = clean.abs().amax()
    _, exponent = torch.frexp(largest)
    unit = torch.exp2(exponent.to(clean.dtype) - 1)
    return torch.where(largest > 0, unit, torch.ones_like(largest))


def _check_real(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(
            f"x must be a real floating-point or integer tensor, got dtype {x.dtype}; describe x.abs() or "
            "torch.view_as_real(x) instead"
        )
