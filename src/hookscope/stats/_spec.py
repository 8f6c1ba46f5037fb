"""What a description counts besides the moments: the near-zero rule and a saturating module's bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["NEAR_ZERO", "Spec", "accumulate_dtype", "wide_dtype"]

NEAR_ZERO = 1e-3
"""The default near-zero threshold: a value is near zero when |x| <= 1e-3."""


@dataclass(frozen=True)
class Spec:
    """The rules a description applies to each finite value.

    Attributes:
        near_zero: The near-zero threshold.
        signed: `False` (everywhere but fastai's `ActivationStats`): near zero means |x| <= near_zero.
            `True` (fastai's rule, kept for `ActivationStats`): x <= near_zero, so every negative value counts.
        bounds: `(low, high)` output bounds of a saturating module (tanh, sigmoid, hardtanh ...), or `None`. A
            value is saturated when it lies within 1% of the output range from either bound.
    """

    near_zero: float = NEAR_ZERO
    signed: bool = False
    bounds: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.near_zero, (int, float)) and math.isfinite(self.near_zero)):
            raise ValueError(f"near_zero must be a finite number, got {self.near_zero!r}")

    def near(self, values: torch.Tensor) -> torch.Tensor:
        """1.0 where a finite value of `values` is near zero, else 0.0 (NaN and inf are never near zero)."""
        magnitude = values if self.signed else values.abs()
        return (magnitude <= self.near_zero).to(values.dtype)

    @property
    def near_zero32(self) -> float:
        """The largest float32 at most `near_zero`: for a float32 `x`, `x <= near_zero32` exactly when
        `x <= near_zero`, so float32 comparisons apply the float64 rule."""
        threshold = float(np.float32(self.near_zero))
        if threshold > self.near_zero:
            threshold = float(np.nextafter(np.float32(threshold), np.float32(-np.inf)))
        return threshold

    def saturated(self, values: torch.Tensor) -> torch.Tensor:
        """1.0 where a finite value is within 1% of the range from a bound (NaN everywhere without bounds)."""
        if self.bounds is None:
            return torch.full_like(values, math.nan)
        low, high = self.bounds
        return ((values - (low + high) / 2).abs() >= 0.49 * (high - low)).to(values.dtype)


def wide_dtype(device: torch.device) -> torch.dtype:
    """Return the widest float dtype `device` computes in: float64, or float32 on MPS (no float64 there)."""
    return torch.float32 if device.type == "mps" else torch.float64


def accumulate_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """Return the dtype running values of `dtype` are kept in: float32 for 16/32-bit floats, wide otherwise.

    Raises:
        TypeError: `dtype` is complex.
    """
    if dtype.is_complex:
        raise TypeError(
            f"tensors pushed into a reducer must be real, got dtype {dtype}; push x.abs() or torch.view_as_real(x)"
        )
    if dtype.is_floating_point and dtype != torch.float64:
        return torch.float32
    return wide_dtype(device)
