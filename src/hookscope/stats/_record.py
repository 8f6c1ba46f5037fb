"""The moments record: what every statistic of a set of values is computed from, combined exactly (Chan).

A record is a float64 vector of `len(RECORD)` columns, or a tensor whose last dimension holds them (one record
per row, per module, per step ...). Every path that describes values (one tensor, many small tensors at once, a
sample of a large tensor) produces records; `combine` merges two records as if their values had been described
together; `finalize` turns records into the statistics users read. These three are the only places where the
formulas live.

Columns (`RECORD`):
- `count`: finite values described. Non-finite values (NaN, ±inf) never enter the moments.
- `mean`: their mean.
- `deviation`: their population standard deviation, sqrt(sum((x - mean)**2) / count). Kept instead of the
  sum of squared deviations so that a record of finite values is always finite, whatever their magnitude.
- `min`, `max`: of the finite values (+inf / -inf when there are none).
- `nonfinite`: NaN and ±inf values seen.
- `near_zero`: finite values that meet the near-zero rule of the describing `Spec`.
- `saturated`: finite values within 1% of the output range from a bound of a saturating module (NaN when the
  module has no bounds).
- `sampled`: values whose statistics were estimated from a sample (0 when described exactly).
"""

from __future__ import annotations

import math

import torch

__all__ = ["RECORD", "STATISTICS", "Column", "combine", "combine_segments", "empty", "finalize", "from_statistics"]

RECORD = ("count", "mean", "deviation", "min", "max", "nonfinite", "near_zero", "saturated", "sampled")
"""The columns of a moments record, in order."""


class Column:
    """Indices of the record's columns (`record[..., Column.MEAN]`)."""

    COUNT, MEAN, DEVIATION, MIN, MAX, NONFINITE, NEAR_ZERO, SATURATED, SAMPLED = range(len(RECORD))


STATISTICS = ("mean", "std", "rms", "min", "max", "near_zero", "nonfinite", "saturated", "count", "sampled")
"""What `finalize` returns, by name: mean; std with Bessel's correction (0 for one value); root mean square; min;
max; the fraction of finite values near zero; the count of non-finite values; the fraction of finite values
saturated; the count of finite values; the fraction of values estimated from a sample."""


def empty(shape: tuple[int, ...] = (), *, saturating: bool = False, device: torch.device | None = None) -> torch.Tensor:
    """Records of no values: zero counts, +inf min, -inf max; `saturated` 0 if `saturating` else NaN."""
    record = torch.zeros((*shape, len(RECORD)), dtype=torch.float64, device=device)
    record[..., Column.MIN] = math.inf
    record[..., Column.MAX] = -math.inf
    if not saturating:
        record[..., Column.SATURATED] = math.nan
    return record


def combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Return the records of the union of the values of `a` and `b` (elementwise over leading dimensions).

    Chan's parallel formulas in a scaled form: the pooled variance is
    `wa * da**2 + wb * db**2 + wa * wb * (mb - ma)**2` with `w = count / total`, computed in units of the largest
    magnitude involved, so that no intermediate overflows. Empty records are neutral. Counts add; min and max
    combine by min and max; `saturated` is NaN when either side is (a module without bounds).
    """
    dtype = torch.promote_types(a.dtype, b.dtype)
    a, b = a.to(dtype), b.to(dtype)
    na, nb = a[..., Column.COUNT], b[..., Column.COUNT]
    total = na + nb
    safe = torch.where(total > 0, total, torch.ones_like(total))
    wa, wb = na / safe, nb / safe
    ma, mb = a[..., Column.MEAN], b[..., Column.MEAN]
    da, db = a[..., Column.DEVIATION], b[..., Column.DEVIATION]
    unit = torch.stack((ma.abs(), mb.abs(), da, db)).amax(0)
    unit = torch.where((unit > 0) & torch.isfinite(unit), unit, torch.ones_like(unit))
    delta = mb / unit - ma / unit
    pooled = wa * (da / unit).square() + wb * (db / unit).square() + wa * wb * delta.square()
    out = a + b  # counts and summed columns; the rest is replaced below
    out[..., Column.MEAN] = wa * ma + wb * mb
    out[..., Column.DEVIATION] = unit * pooled.clamp(min=0).sqrt()
    out[..., Column.MIN] = torch.minimum(a[..., Column.MIN], b[..., Column.MIN])
    out[..., Column.MAX] = torch.maximum(a[..., Column.MAX], b[..., Column.MAX])
    return out


def combine_segments(records: torch.Tensor, segment: torch.Tensor, groups: int) -> torch.Tensor:
    """Return the (groups, len(RECORD)) records of the union of the records (N, len(RECORD)) in each group
    (`segment[i]`: the group of record `i`): `combine` of all of a group's records at once, in a fixed number of
    calls. Same scaled formulas: the pooled variance sums `w_i * (d_i**2 + (m_i - mean)**2)` in units of the
    group's largest magnitude."""
    records = records.double()
    device = records.device
    count = records[:, Column.COUNT]
    total = torch.zeros(groups, dtype=torch.float64, device=device).index_add_(0, segment, count)
    weight = count / total.clamp(min=1).index_select(0, segment)
    mean, deviation = records[:, Column.MEAN], records[:, Column.DEVIATION]
    magnitude = torch.where(count > 0, torch.maximum(mean.abs(), deviation), 0.0)
    unit = torch.zeros(groups, dtype=torch.float64, device=device).scatter_reduce_(0, segment, magnitude, "amax")
    unit = torch.where((unit > 0) & torch.isfinite(unit), unit, torch.ones_like(unit))
    own = unit.index_select(0, segment)
    pooled_mean = torch.zeros_like(total).index_add_(0, segment, weight * (mean / own)) * unit
    spread = (deviation / own).square() + (mean / own - pooled_mean.index_select(0, segment) / own).square()
    pooled = torch.zeros_like(total).index_add_(0, segment, weight * spread)
    out = torch.zeros(groups, len(RECORD), dtype=torch.float64, device=device).index_add_(0, segment, records)
    out[:, Column.MEAN] = pooled_mean
    out[:, Column.DEVIATION] = unit * pooled.clamp(min=0).sqrt()
    inf = torch.full((groups,), math.inf, dtype=torch.float64, device=device)
    out[:, Column.MIN] = inf.scatter_reduce(0, segment, records[:, Column.MIN], "amin")
    out[:, Column.MAX] = (-inf).scatter_reduce(0, segment, records[:, Column.MAX], "amax")
    return out


def finalize(records: torch.Tensor) -> torch.Tensor:
    """Return the statistics of `STATISTICS` (last dimension) of `records`, float64; NaN where nothing finite was
    seen (but the non-finite count and the count, which are 0 or more)."""
    records = records.double()
    count = records[..., Column.COUNT]
    seen = count > 0
    safe = torch.where(seen, count, torch.ones_like(count))
    mean, deviation = records[..., Column.MEAN], records[..., Column.DEVIATION]
    bessel = torch.where(count > 1, (safe / (safe - 1).clamp(min=1)).sqrt(), torch.zeros_like(count))
    total = count + records[..., Column.NONFINITE]
    nan = torch.full_like(count, math.nan)
    values = {
        "mean": mean,
        "std": deviation * bessel,
        "rms": torch.hypot(mean, deviation),
        "min": records[..., Column.MIN],
        "max": records[..., Column.MAX],
        "near_zero": records[..., Column.NEAR_ZERO] / safe,
        "saturated": records[..., Column.SATURATED] / safe,
    }
    out = {name: torch.where(seen, value, nan) for name, value in values.items()}
    out["nonfinite"] = records[..., Column.NONFINITE]
    out["count"] = count
    out["sampled"] = torch.where(total > 0, records[..., Column.SAMPLED] / total.clamp(min=1), nan)
    return torch.stack([out[name] for name in STATISTICS], dim=-1)


def from_statistics(statistics: torch.Tensor) -> torch.Tensor:
    """Invert `finalize`: the records whose statistics (last dimension, `STATISTICS`) are `statistics`.

    Used to merge statistics that were saved finalized (results of several ranks). Rows with a NaN or zero count
    become empty records.
    """
    statistics = statistics.double()
    column = {name: statistics[..., k] for k, name in enumerate(STATISTICS)}
    count = column["count"].nan_to_num(0.0)
    seen = count > 0
    safe = torch.where(seen, count, torch.ones_like(count))
    record = empty(tuple(statistics.shape[:-1]), saturating=True, device=statistics.device)
    nonfinite = column["nonfinite"].nan_to_num(0.0)
    deviation = column["std"] * ((safe - 1).clamp(min=0) / safe).sqrt()
    filled = {
        Column.COUNT: count,
        Column.MEAN: column["mean"],
        Column.DEVIATION: deviation,
        Column.MIN: column["min"],
        Column.MAX: column["max"],
        Column.NEAR_ZERO: column["near_zero"] * safe,
        Column.SATURATED: column["saturated"] * safe,
        Column.SAMPLED: column["sampled"].nan_to_num(0.0) * (count + nonfinite),
    }
    for index, value in filled.items():
        record[..., index] = torch.where(seen, value, record[..., index])
    record[..., Column.NONFINITE] = nonfinite
    return record
