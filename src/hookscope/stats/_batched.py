"""Describe many small tensors at once: the records of groups of values, in a fixed number of torch calls.

On small models monitoring costs the number of torch calls, not the number of values, so small tensors are
concatenated (float64) and every group (a module's output in one step, a parameter's gradient ...) is described
by segment reductions over `segment` (the group of each value). The results equal `describe` / `norm_of` of each
group's values up to float rounding; the layout of the groups is the caller's (`Segments` holds what depends only
on it, to be cached).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ._record import RECORD, Column
from ._spec import Spec

__all__ = ["Segments", "describe_segments", "norm_segments"]


class Segments:
    """The arrangement of values into groups: what `describe_segments` / `norm_segments` need besides the values.

    Args:
        sizes: The number of values of each part, in order (a group may have several parts).
        groups: The group of each part.
        device: Where the values will be.
        bounds: Per group, the `(low, high)` bounds of a saturating module, or `None` (its length may add groups
            without values).
    """

    def __init__(
        self,
        sizes: list[int],
        groups: list[int],
        device: torch.device,
        bounds: list[tuple[float, float] | None] | None = None,
    ) -> None:
        count = max(max(groups, default=-1) + 1, len(bounds or ()))
        totals = [0] * count
        for group, size in zip(groups, sizes, strict=True):
            totals[group] += size
        self.groups = count
        self.values = sum(sizes)
        self.sizes = _to(torch.tensor(totals, dtype=torch.float64), device)
        segment = np.repeat(np.asarray(groups, dtype=np.int64), np.asarray(sizes, dtype=np.int64))
        self.segment = _to(torch.from_numpy(segment), device)  # (torch.repeat_interleave is slow on the CPU)
        self.saturation: tuple[torch.Tensor, torch.Tensor] | None = None
        if bounds is not None and any(b is not None for b in bounds):
            middle = [math.nan if b is None else (b[0] + b[1]) / 2 for b in bounds]
            half = [math.nan if b is None else 0.49 * (b[1] - b[0]) for b in bounds]
            self.saturation = (
                _to(torch.tensor(middle, dtype=torch.float64), device),
                _to(torch.tensor(half, dtype=torch.float64), device),
            )


def describe_segments(values: torch.Tensor, segments: Segments, spec: Spec) -> torch.Tensor:
    """Return the (groups, len(RECORD)) float64 records of the groups of `values` (flat float64 of values from
    16/32-bit tensors, so that no square overflows). `spec.bounds` is ignored: bounds are per group here."""
    seg, groups = segments.segment, segments.groups
    finite = torch.isfinite(values).double()
    clean = torch.where(finite > 0, values, 0.0)
    columns = [finite, clean, spec.near(clean) * finite]
    if segments.saturation is not None:
        middle, half = (t.index_select(0, seg) for t in segments.saturation)
        columns.append(((clean - middle).abs() >= half).double() * finite)
    totals = torch.zeros(len(columns), groups, dtype=torch.float64, device=values.device)
    totals.index_add_(1, seg, torch.stack(columns))
    count = totals[0]
    safe = count.clamp(min=1)
    mean = totals[1] / safe
    squares = torch.zeros(groups, dtype=torch.float64, device=values.device)
    squares.index_add_(0, seg, ((clean - mean.index_select(0, seg)) * finite).square())
    smallest = torch.full((groups,), math.inf, dtype=torch.float64, device=values.device)
    largest = torch.full_like(smallest, -math.inf)
    smallest.scatter_reduce_(0, seg, torch.where(finite > 0, values, math.inf), "amin")
    largest.scatter_reduce_(0, seg, torch.where(finite > 0, values, -math.inf), "amax")
    if segments.saturation is None:
        saturated = torch.full_like(count, math.nan)
    else:
        saturated = torch.where(segments.saturation[0].isnan(), math.nan, totals[3])
    columns_by_index = {
        Column.COUNT: count,
        Column.MEAN: mean,
        Column.DEVIATION: (squares / safe).sqrt(),
        Column.MIN: smallest,
        Column.MAX: largest,
        Column.NONFINITE: segments.sizes - count,
        Column.NEAR_ZERO: totals[2],
        Column.SATURATED: saturated,
        Column.SAMPLED: torch.zeros_like(count),
    }
    return torch.stack([columns_by_index[k] for k in range(len(RECORD))], dim=1)


def norm_segments(values: torch.Tensor, segments: Segments) -> torch.Tensor:
    """Return the (groups, len(NORM)) float64 norm records of the groups of `values` (as `describe_segments`)."""
    finite = torch.isfinite(values)
    clean = torch.where(finite, values, 0.0)
    totals = torch.zeros(2, segments.groups, dtype=torch.float64, device=values.device)
    totals.index_add_(1, segments.segment, torch.stack((clean.square(), (~finite).double())))
    sizes = segments.sizes
    return torch.stack((totals[0].sqrt(), totals[1], sizes, torch.zeros_like(sizes)), dim=1)


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move a small tensor built on the host to `device` (pinned and asynchronous on CUDA: no sync)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
