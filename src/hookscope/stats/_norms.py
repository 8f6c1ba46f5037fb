"""Norms (of gradients, of updates, of weights) and the update-to-weight ratio.

A norm record is a float64 vector of `NORM` columns: the L2 norm of the finite values, the count of non-finite
values, the count of values, and how many of them were estimated from a sample. The norm is kept rather than
the sum of squares so that it stays finite whenever the norm itself is representable; records combine as the
root of summed squares, in units of the largest norm so that it never overflows (`root_sum_squares`: the one
definition of merging norms, which `combine_norms`, `combine_norm_segments`, the distributed merges and the doctor
call). Complex tensors count |z| (their real and imaginary
parts both).
"""

from __future__ import annotations

import math

import torch

from ._describe import take_sample
from ._sample import Sampler

__all__ = [
    "NORM",
    "combine_norm_segments",
    "combine_norms",
    "estimate_norms",
    "norm_of",
    "ratio_of_norms",
    "real_view",
    "root_sum_squares",
]

NORM = ("norm", "nonfinite", "count", "sampled")
"""The columns of a norm record."""


def real_view(x: torch.Tensor) -> torch.Tensor:
    """`x` as a real tensor: complex tensors as their (real, imaginary) pairs, so that norms count |z|."""
    return torch.view_as_real(x) if x.is_complex() else x


def norm_of(x: torch.Tensor, sampler: Sampler | None = None) -> torch.Tensor:
    """Return the (len(NORM),) float64 norm record of `x`, on its device, without a host sync.

    Exact without a `sampler`, for float64 tensors and below `sampler.size` values: the squares of narrower values
    summed in float64 (exact squares, never overflowing: one pass), float64 values scaled by a power of two so that
    no square overflows. With a `sampler`, two passes (a float32 sum of squares and min/max) and a sample
    (`estimate_norms`): the norm is exact unless a value is not finite or the float32 sum of squares overflows; it
    is then estimated from the sample's finite values.
    """
    x = real_view(x.detach())
    n = x.numel()
    if n == 0:
        return torch.zeros(len(NORM), dtype=torch.float64, device=x.device)
    if sampler is None or n < max(sampler.size, 11) or x.dtype == torch.float64 or not x.is_floating_point():
        return _exact_norm(x.reshape(-1))
    sample = take_sample(x, sampler, with_sum=False)
    sampled = _exact_norm(sample.values[: sample.count])[None]
    numel = x.new_full((1,), float(n), dtype=torch.float64)  # filled on the device: no copy from the host
    return estimate_norms(torch.stack(sample.raw).float()[None], numel, sampled)[0]


def estimate_norms(raw: torch.Tensor, numel: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """The norm records (G, len(NORM)) of G tensors from their exact readings (G, len(RAW)) (`take_sample`),
    their numbers of values (G,) and their samples' norm records (G, len(NORM))."""
    raw, n = raw.double(), numel.double()
    squares, smallest, largest = raw[..., 1], raw[..., 2], raw[..., 3]
    present = ~(torch.isfinite(smallest) & torch.isfinite(largest))
    seen = sampled[..., 2].clamp(min=1)
    exact = torch.isfinite(squares) & ~present
    # each sampled value stands for n / seen values, a non-finite one for as many that add nothing to the norm
    norm = torch.where(exact, squares.sqrt(), sampled[..., 0] * (n / seen).sqrt())
    nonfinite = torch.where(present, (sampled[..., 1] * n / seen).clamp(min=1.0), 0.0)
    return torch.stack((norm, nonfinite, n, n), dim=-1)


def _exact_norm(flat: torch.Tensor) -> torch.Tensor:
    finite = torch.isfinite(flat)
    clean = torch.where(finite, flat, 0)
    if flat.dtype == torch.float64:  # scaled by a power of two, so that no square overflows
        largest = clean.abs().amax()
        _, exponent = torch.frexp(largest)
        unit = torch.where(largest > 0, torch.exp2(exponent.double() - 1), torch.ones_like(largest))
        scaled = clean / unit
        norm = torch.dot(scaled, scaled).sqrt() * unit
    else:  # squares of narrower values are exact in float64 and never overflow there: one pass (one fused loop
        clean = clean.double()  # when compiled)
        norm = torch.dot(clean, clean).sqrt()
    count = torch.full_like(norm, flat.numel())
    return torch.stack((norm, count - finite.sum(), count, torch.zeros_like(norm)))


def root_sum_squares(norms: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The norm of the union of values whose norms are `norms`, along `dim`: the root of their summed squares,
    computed in units of the largest (float64; never overflowing while the result is representable).

    Example:
        >>> root_sum_squares(torch.tensor([3e200, 4e200])).item()
        5e+200
    """
    norms = norms.double()
    unit = _unit(norms.abs().amax(dim, keepdim=True))
    return ((norms / unit).square().sum(dim, keepdim=True).sqrt() * unit).squeeze(dim)


def _unit(largest: torch.Tensor) -> torch.Tensor:
    """The unit of `root_sum_squares`: the largest norm, or 1 where it is 0 or not finite."""
    return torch.where((largest > 0) & torch.isfinite(largest), largest, torch.ones_like(largest))


def combine_norms(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The norm records of the union of the values of `a` and `b` (elementwise over leading dimensions)."""
    out = a.double() + b.double()
    out[..., 0] = root_sum_squares(torch.stack((a[..., 0], b[..., 0])), dim=0)
    return out


def combine_norm_segments(norms: torch.Tensor, segment: torch.Tensor, groups: int) -> torch.Tensor:
    """The (groups, len(NORM)) norm records of the union of the records (N, len(NORM)) of each group: the root of
    summed squares in units of the group's largest norm (never overflowing), the counts summed."""
    norms = norms.double()
    unit = torch.zeros(groups, dtype=torch.float64, device=norms.device)
    unit = unit.scatter_reduce_(0, segment, norms[:, 0], "amax")
    unit = _unit(unit)
    out = torch.zeros(groups, len(NORM), dtype=torch.float64, device=norms.device).index_add_(0, segment, norms)
    squares = torch.zeros_like(unit).index_add_(0, segment, (norms[:, 0] / unit.index_select(0, segment)).square())
    out[:, 0] = squares.sqrt() * unit
    return out


def ratio_of_norms(update: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The update-to-weight ratio ||dW|| / ||W|| elementwise: 0 where both are 0, inf where only ||W|| is."""
    zero = torch.zeros_like(update)
    # equivalent mutant `0 -> -1`: norms are >= 0 (or NaN) and `update / safe` is only read where weight > 0
    safe = torch.where(weight > 0, weight, torch.ones_like(weight))
    return torch.where(weight > 0, update / safe, torch.where(update > 0, zero + math.inf, zero))
