"""Describe one tensor: its moments record, exactly, or from a fixed-size sample above `SAMPLE_ABOVE` values.

`describe(x, spec)` is the definition every other path is tested against: every value in float64 (float64
inputs are first scaled by a power of two, so that no square overflows), non-finite values counted apart. It
reads the tensor about eight times, which is what a large activation cannot afford every step: `describe_large`
with a `Sampler` reads it twice (sum, min/max) and estimates the rest from at most `SAMPLE_SIZE` values taken at a prime
stride (see `_sample.py`). Both return a `Described`: the record and the values the histogram and the unit
activity are counted from (all values, or the sample with the weight each sampled value stands for).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._record import RECORD, Column, empty
from ._sample import SAMPLE_ABOVE, Sampler
from ._spec import Spec, wide_dtype

__all__ = ["Described", "describe", "describe_large"]


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


def describe_large(x: torch.Tensor, spec: Spec, sampler: Sampler | None) -> Described:
    """Describe `x`: exactly (`describe`) without a `sampler`, for float64 tensors and for tensors of at most
    `SAMPLE_ABOVE` values; otherwise from a sample, in two passes over `x` and a fixed cost.

    Four passes over `x` (sum, sum of squares, min/max, the sample). Exact in the sampled description: the count,
    the mean and the deviation (unless `x` holds non-finite values, its float32 sums overflow, or |mean| > 4 std,
    where rounding would cancel: the deviation is then the sample's around the exact mean), the min and max
    (unless one of them is ±inf or NaN) and whether any value is non-finite. Estimated from the sample: the
    near-zero and saturated counts, the number of non-finite values (at least 1 when there is one), and whatever
    falls back to the sample above.
    """
    _check_real(x)
    n = x.numel()
    if sampler is None or n <= SAMPLE_ABOVE or x.dtype == torch.float64 or not x.is_floating_point():
        return describe(x, spec)
    x = x.detach()
    total = x.sum(dtype=torch.float32)
    squares = torch.linalg.vector_norm(x, dtype=torch.float32).double().square()
    smallest, largest = torch.aminmax(x)
    index = sampler.index(n, x.device)
    values = torch.take(x, index).double()
    finite = torch.isfinite(values).double()
    clean = torch.where(finite > 0, values, 0.0)
    kept = finite.sum().clamp(min=1)
    present = ~(torch.isfinite(smallest) & torch.isfinite(largest))
    missing = ((1.0 - finite.mean()) * n).clamp(min=1.0)
    nonfinite = torch.where(present, missing, 0.0)
    count = n - nonfinite
    exact = torch.isfinite(total) & torch.isfinite(squares) & ~present
    mean = torch.where(exact, total.double() / n, clean.sum() / kept)
    # The variance from the exact sums is exact up to float32 rounding of the sum of squares (relative 1e-4 at
    # worst), which cancellation amplifies by 1 + mean**2 / variance: used while |mean| <= 4 std, else the sample's.
    one_pass = (squares / n - mean.square()).clamp(min=0)
    sampled = ((clean - mean) * finite).square().sum().div(kept)
    deviation = torch.where(exact & (mean.square() <= 16 * one_pass), one_pass, sampled).sqrt()
    inf = math.inf
    columns = {
        Column.COUNT: count,
        Column.MEAN: mean,
        Column.DEVIATION: deviation,
        Column.MIN: torch.where(
            torch.isfinite(smallest), smallest.double(), torch.where(finite > 0, values, inf).amin()
        ),
        Column.MAX: torch.where(
            torch.isfinite(largest), largest.double(), torch.where(finite > 0, values, -inf).amax()
        ),
        Column.NONFINITE: nonfinite,
        Column.NEAR_ZERO: (spec.near(clean) * finite).sum() * (count / kept),
        Column.SATURATED: (spec.saturated(clean) * finite).sum() * (count / kept),
        Column.SAMPLED: torch.full_like(count, float(n)),
    }
    record = torch.stack([columns[k] for k in range(len(RECORD))])
    return Described(record, values, finite, count / kept, index)


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
