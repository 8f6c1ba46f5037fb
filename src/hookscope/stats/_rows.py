"""Describe many samples at once: they all have the same width, so they are the rows of one matrix.

Samples are estimates, so they are described in float32 (on the CPU several times faster than float64), by the
same rules as every other path: the near-zero threshold is rounded so that float32 comparisons apply it exactly,
and each row is divided by a power of two (exact) so that no sum or square overflows. On the CPU, allocating a
block-sized tensor costs more than the arithmetic on it (fresh pages each time), so a table describes its samples
in blocks of `SAMPLE_BLOCK` rows written into a `Workspace` it keeps; comparisons are written in place on float
tensors (bool tensors and `where` cost several times more per value).
"""

from __future__ import annotations

import math

import torch

from ._batched import Workspace, finite_mask
from ._record import RECORD, Column
from ._spec import Spec

__all__ = ["SAMPLE_BLOCK", "Rows", "describe_rows", "norm_rows"]

SAMPLE_BLOCK = 32
"""Samples described together: a (32, width) float32 block stays in the CPU's cache."""


class Rows:
    """Rows of sampled values, ready to describe.

    Attributes:
        values: (rows, width) float32: each row a sample, padded to the width with copies of its first value
            (`Sampler`): padding never changes a row's min or max.
        finite: 1.0 where an entry is a finite value of its row's sample, else 0.0 (padding is not).
        clean: The values, 0.0 where not finite or padding.
        seen: (rows,) the size of each sample.
        unit: (rows,) a power of two at least half of every |clean| value of the row: dividing by it is exact,
            and no square or sum of the quotients overflows.
        work: The workspace the buffers above and the describers' scratch come from.
    """

    def __init__(self, values: torch.Tensor, members: torch.Tensor, work: Workspace | None = None) -> None:
        work = work or Workspace()
        self.values, self.work = values, work
        self.finite = finite_mask(values, out=work.get("finite", values)).mul_(members)
        self.clean = torch.nan_to_num(values, 0.0, 0.0, 0.0, out=work.get("clean", values)).mul_(members)
        self.seen = members.sum(1)
        _, exponent = torch.frexp(torch.abs(self.clean, out=work.get("scratch", values)).amax(1))  # m * 2**e
        self.unit = torch.ldexp(torch.ones_like(self.seen), exponent - 1)  # 2**(e - 1) <= 2**127

    def scratch(self) -> torch.Tensor:
        """A block-sized float32 buffer to compute into (overwritten by the next caller)."""
        return self.work.get("scratch", self.values)


def describe_rows(rows: Rows, spec: Spec, saturation: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Return the (rows, len(RECORD)) float64 records of the samples in `rows`. `saturation`: per row, the middle
    and half-width (float32) of a saturating module's range (NaN for the others)."""
    finite, clean, unit = rows.finite, rows.clean, rows.unit
    count = finite.sum(1)
    safe = count.clamp(min=1)
    scaled = torch.div(clean, unit[:, None], out=rows.scratch())
    mean = scaled.sum(1).div_(safe)
    deviation = scaled.sub_(mean[:, None]).mul_(finite).square_().sum(1).div_(safe).sqrt_()
    magnitude = rows.scratch().copy_(clean) if spec.signed else torch.abs(clean, out=rows.scratch())
    near = magnitude.le_(spec.near_zero32).mul_(finite).sum(1)
    if saturation is None:
        saturated = torch.full_like(count, math.nan)
    else:
        middle, half = saturation
        hits = torch.sub(clean, middle[:, None], out=rows.scratch()).abs_().ge_(half[:, None]).mul_(finite).sum(1)
        saturated = torch.where(middle.isnan(), math.nan, hits)
    inf, wide = math.inf, unit.double()
    columns_by_index = {
        Column.COUNT: count,
        Column.MEAN: mean.double() * wide,
        Column.DEVIATION: deviation.double() * wide,
        Column.MIN: torch.nan_to_num(rows.values, inf, inf, inf, out=rows.scratch()).amin(1),  # inf: none finite
        Column.MAX: torch.nan_to_num(rows.values, -inf, -inf, -inf, out=rows.scratch()).amax(1),
        Column.NONFINITE: rows.seen - count,
        Column.NEAR_ZERO: near,
        Column.SATURATED: saturated,
        Column.SAMPLED: torch.zeros_like(count),
    }
    return torch.stack([columns_by_index[k].double() for k in range(len(RECORD))], dim=1)


def norm_rows(rows: Rows) -> torch.Tensor:
    """Return the (rows, len(NORM)) float64 norm records of the samples in `rows`."""
    scaled = torch.div(rows.clean, rows.unit[:, None], out=rows.scratch())
    norm = scaled.square_().sum(1).sqrt_().double() * rows.unit.double()
    seen = rows.seen.double()
    return torch.stack((norm, seen - rows.finite.sum(1).double(), seen, torch.zeros_like(norm)), dim=1)
