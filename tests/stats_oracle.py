"""The one independent float64 NumPy oracle every statistics path is tested against.

It shares nothing with `hookscope.stats`: plain NumPy on the tensor's values converted to float64, scaled by the
largest magnitude (a plain float division, not a power of two) so that values near the float64 maximum do not
overflow, the histogram radius found with `math.frexp` on the host and the counts by `numpy.histogram`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch


@dataclass
class Expected:
    """What every path must report for a set of values."""

    count: int
    nonfinite: int
    mean: float
    std: float
    rms: float
    min: float
    max: float
    near_zero: float
    saturated: float
    norm: float


def values_of(*tensors: torch.Tensor) -> np.ndarray:
    """All values of `tensors`, flat, as float64 NumPy (exact: every float dtype converts exactly)."""
    parts = [t.detach().reshape(-1).to(torch.float64).cpu().numpy() for t in tensors]
    return np.concatenate(parts) if parts else np.zeros(0)


def expected(
    values: np.ndarray,
    near_zero: float = 1e-3,
    signed: bool = False,
    bounds: tuple[float, float] | None = None,
) -> Expected:
    """The statistics of `values` (float64) by the README's definitions."""
    finite = values[np.isfinite(values)]
    n = finite.size
    nan = math.nan
    if n == 0:
        return Expected(0, int(values.size), nan, nan, nan, nan, nan, nan, nan, 0.0)
    scale = float(np.max(np.abs(finite))) or 1.0
    scaled = finite / scale
    mean = float(np.mean(scaled)) * scale
    std = float(np.std(scaled, ddof=1)) * scale if n > 1 else 0.0
    rms = math.sqrt(float(np.mean(scaled * scaled))) * scale
    near = float(np.mean((finite if signed else np.abs(finite)) <= near_zero))
    saturated = nan
    if bounds is not None:
        low, high = bounds
        saturated = float(np.mean(np.abs(finite - (low + high) / 2) >= 0.49 * (high - low)))
    norm = float(np.linalg.norm(scaled)) * scale
    return Expected(
        n, int(values.size - n), mean, std, rms, float(finite.min()), float(finite.max()), near, saturated, norm
    )


def auto_exponent(values: np.ndarray) -> int | None:
    """The exponent e of the smallest power of two strictly above the largest finite magnitude (None: all zero)."""
    finite = values[np.isfinite(values)]
    largest = float(np.max(np.abs(finite))) if finite.size else 0.0
    if largest == 0.0:
        return None
    _, exponent = math.frexp(largest)  # largest = mantissa * 2**exponent, 0.5 <= mantissa < 1
    return max(exponent, -1021)


def auto_histogram(values: np.ndarray, bins: int, exponent: int) -> np.ndarray:
    """Counts of the finite values over [-2**exponent, 2**exponent) in `bins` equal bins, each bin found in exact
    rational arithmetic (`fractions.Fraction`), so values on an edge land where the edge says."""
    out = np.zeros(bins)
    radius = Fraction(2) ** exponent
    for value in values[np.isfinite(values)].tolist():
        out[math.floor((Fraction(value) + radius) * bins / (2 * radius))] += 1
    return out


def auto_shares(values: np.ndarray, bins: int, exponent: int) -> np.ndarray:
    """Each bin's share of the finite values over [-2**exponent, 2**exponent) by numpy.histogram (for the
    bounded-error tests of large tensors, where a value on an edge does not matter)."""
    finite = values[np.isfinite(values)]
    counts, _ = np.histogram(finite / math.ldexp(1.0, exponent), bins=bins, range=(-1.0, 1.0))
    return counts / max(finite.size, 1)


def fixed_histogram(values: np.ndarray, bins: int, bounds: tuple[float, float]) -> tuple[np.ndarray, int, int]:
    """numpy.histogram of the finite values over `bounds`, and the counts below and above it."""
    finite = values[np.isfinite(values)]
    low, high = bounds
    counts, _ = np.histogram(finite, bins=bins, range=(low, high))
    return counts.astype(np.float64), int(np.sum(finite < low)), int(np.sum(finite > high))


def close(actual: float, wanted: float, scale: float, rtol: float = 1e-9) -> bool:
    """Whether `actual` matches `wanted` within `rtol` of `scale` (NaN matches NaN)."""
    if math.isnan(wanted) or math.isnan(actual):
        return math.isnan(wanted) and math.isnan(actual)
    if math.isinf(wanted) or math.isinf(actual):
        return actual == wanted
    return abs(actual - wanted) <= rtol * max(scale, abs(wanted), 1e-300)
