"""Norms (of gradients, of updates, of weights) and the update-to-weight ratio.

A norm record is a float64 vector of `NORM` columns: the L2 norm of the finite values, the count of non-finite
values, the count of values, and how many of them were estimated from a sample. The norm is kept rather than
the sum of squares so that it stays finite whenever the norm itself is representable; records combine as the
root of summed squares (`combine_norms`, i.e. `hypot`). Complex tensors count |z| (their real and imaginary
parts both).
"""

from __future__ import annotations

import math

import torch

from ._sample import SAMPLE_ABOVE, Sampler

__all__ = ["NORM", "combine_norm_segments", "combine_norms", "norm_of", "ratio_of_norms", "real_view"]

NORM = ("norm", "nonfinite", "count", "sampled")
"""The columns of a norm record."""


def real_view(x: torch.Tensor) -> torch.Tensor:
    """`x` as a real tensor: complex tensors as their (real, imaginary) pairs, so that norms count |z|."""
    return torch.view_as_real(x) if x.is_complex() else x


def norm_of(x: torch.Tensor, sampler: Sampler | None = None) -> torch.Tensor:
    """Return the (len(NORM),) float64 norm record of `x`, on its device, without a host sync.

    Exact without a `sampler` or up to `SAMPLE_ABOVE` values: float64, scaled by a power of two so that no square
    overflows. With a `sampler`, two passes (a float32 dot product and min/max): the norm is exact unless a value
    is not finite or the float32 sum of squares overflows; it is then estimated from a sample of the finite
    values (and the count of non-finite values is estimated, at least 1).
    """
    x = real_view(x.detach())
    n = x.numel()
    if n == 0:
        return torch.zeros(len(NORM), dtype=torch.float64, device=x.device)
    if sampler is None or n <= SAMPLE_ABOVE or x.dtype == torch.float64:
        return _exact_norm(x.reshape(-1))
    flat = x.reshape(-1) if x.is_contiguous() else None
    squares = torch.dot(flat, flat) if flat is not None and x.dtype == torch.float32 else x.float().square().sum()
    smallest, largest = torch.aminmax(x)
    present = ~(torch.isfinite(smallest) & torch.isfinite(largest))
    index = sampler.index(n, x.device)
    sample = _exact_norm(torch.take(x, index))
    kept = (index.numel() - sample[1]).clamp(min=1)
    estimate = sample[0] * (n / kept).sqrt()
    exact = torch.isfinite(squares) & ~present
    nonfinite = torch.where(present, (sample[1] * (n / index.numel())).clamp(min=1.0), 0.0)
    norm = torch.where(exact, squares.double().sqrt(), estimate)
    return torch.stack((norm, nonfinite, torch.full_like(norm, n), torch.full_like(norm, n)))


def _exact_norm(flat: torch.Tensor) -> torch.Tensor:
    values = flat.double()
    finite = torch.isfinite(values)
    clean = torch.where(finite, values, 0.0)
    largest = clean.abs().amax()
    _, exponent = torch.frexp(largest)
    unit = torch.where(largest > 0, torch.exp2(exponent.double() - 1), torch.ones_like(largest))
    scaled = clean / unit
    norm = torch.dot(scaled, scaled).sqrt() * unit
    count = torch.full_like(norm, values.numel())
    return torch.stack((norm, count - finite.sum(), count, torch.zeros_like(norm)))


def combine_norms(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The norm records of the union of the values of `a` and `b` (elementwise over leading dimensions)."""
    out = a.double() + b.double()
    out[..., 0] = torch.hypot(a[..., 0].double(), b[..., 0].double())
    return out


def combine_norm_segments(norms: torch.Tensor, segment: torch.Tensor, groups: int) -> torch.Tensor:
    """The (groups, len(NORM)) norm records of the union of the records (N, len(NORM)) of each group: the root of
    summed squares in units of the group's largest norm (never overflowing), the counts summed."""
    norms = norms.double()
    unit = torch.zeros(groups, dtype=torch.float64, device=norms.device)
    unit = unit.scatter_reduce_(0, segment, norms[:, 0], "amax")
    unit = torch.where((unit > 0) & torch.isfinite(unit), unit, torch.ones_like(unit))
    out = torch.zeros(groups, len(NORM), dtype=torch.float64, device=norms.device).index_add_(0, segment, norms)
    squares = torch.zeros_like(unit).index_add_(0, segment, (norms[:, 0] / unit.index_select(0, segment)).square())
    out[:, 0] = squares.sqrt() * unit
    return out


def ratio_of_norms(update: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The update-to-weight ratio ||dW|| / ||W|| elementwise: 0 where both are 0, inf where only ||W|| is."""
    zero = torch.zeros_like(update)
    safe = torch.where(weight > 0, weight, torch.ones_like(weight))
    return torch.where(weight > 0, update / safe, torch.where(update > 0, zero + math.inf, zero))
