"""The one histogram kernel and its range policy.

Automatic range (the default everywhere): each histogram covers `[-2**e, 2**e)` where `2**e` is the smallest
power of two strictly above the largest finite magnitude it counts, in `bins` equal bins (`bins` even). Two
histograms of the same bins but different exponents combine exactly: the one with the smaller exponent is
re-binned (`rebin`) by merging groups of `2**(E - e)` adjacent bins, because power-of-two edges nest. So a
histogram follows the data as a run goes (its range widens when larger values arrive; nothing is ever clamped
into an end bin), and histograms of different steps, records or ranks are brought to one range without
approximation. A histogram of zeros only has the exponent `EXPONENT_NONE` (below any other: neutral in a max).

Fixed range `(low, high)`: `bins` equal bins, `[edge_i, edge_i+1)` with the last one closed, as
`numpy.histogram`; values below or above are counted in the two extra columns `UNDERFLOW` and `OVERFLOW`.

Counts are float64 rows of `bins + 2` columns (the bins, underflow, overflow). Non-finite values are counted
in no column (the moments record counts them). Everything stays on the device.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable

import torch

from .._transfer import to_device
from ._batched import Workspace, flat_buffers

__all__ = [
    "EXPONENT_MAX",
    "EXPONENT_MIN",
    "EXPONENT_NONE",
    "added_at",
    "auto_edges",
    "check_bins",
    "check_range",
    "counts",
    "exponent_of",
    "exponent_of_edges",
    "fixed_edges",
    "on_widest_range",
    "range_exponent",
    "rebin",
    "row_counts",
    "segment_counts",
    "tally",
    "widest_exponent",
]

# equivalent mutant `1100 -> 1099`: any value below EXPONENT_MIN does (neutral in a max, only read with `<=`)
# equivalent mutant `1100 -> 1101`: as above
EXPONENT_NONE = -1100
"""The exponent of a histogram with no non-zero finite value (its values all sit in the middle bin)."""
EXPONENT_MIN = -1021
"""The smallest exponent used: magnitudes below 2**-1022 (subnormal) share the middle bins."""
EXPONENT_MAX = 1024
"""2**1024 is just above the largest float64."""
UNDERFLOW, OVERFLOW = -2, -1
"""Columns of the counts of values below / above a fixed range."""
EXACT_CODES = 1 << 24
"""Float32 holds every integer up to this one: `row_counts` adds the rows' column offsets to their codes in float32
while its rows times their columns are at most this (every code is below that)."""


def check_bins(name: str, bins: object, automatic: bool) -> int:
    """Return `bins` (the argument `name`) checked: a positive int, even for the automatic range (so that the edges
    nest).

    Raises:
        ValueError: it is not.
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1 or (automatic and bins % 2):
        rule = (
            "a positive even int (a range that follows the data doubles symmetrically)"
            if automatic
            else "a positive int"
        )
        raise ValueError(f"{name} must be {rule}, got {bins!r}")
    return bins


def check_range(name: str, bounds: object) -> tuple[float, float] | None:
    """Return `bounds` as `(low, high)` floats, or `None`.

    Raises:
        ValueError: it is not a pair of finite numbers with low < high.
    """
    if bounds is None:
        return None
    pair = list(bounds) if isinstance(bounds, (tuple, list)) else []
    numbers = [b for b in pair if isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b)]
    if len(pair) != 2 or len(numbers) != 2 or not numbers[0] < numbers[1]:
        raise ValueError(
            f"{name} must be a pair (low, high) of finite numbers with low < high, or None (a range that follows "
            f"the data), got {bounds!r}"
        )
    return float(numbers[0]), float(numbers[1])


def exponent_of(largest: torch.Tensor) -> torch.Tensor:
    """The int64 exponent `e` of the automatic range of values whose largest finite magnitude is `largest`:
    `2**e` is the smallest power of two strictly above it (`EXPONENT_NONE` for 0, NaN or inf); elementwise."""
    _, exponent = torch.frexp(largest.double())  # largest = m * 2**e with 0.5 <= m < 1: largest < 2**e
    exponent = exponent.long().clamp(min=EXPONENT_MIN)
    valid = (largest > 0) & torch.isfinite(largest)
    return torch.where(valid, exponent, torch.full_like(exponent, EXPONENT_NONE))


def range_exponent(values: torch.Tensor) -> torch.Tensor:
    """The 0-d int64 exponent of the automatic range of `values`: `exponent_of` their largest finite magnitude."""
    values = values.detach()
    if values.numel() == 0:
        return exponent_of(values.new_zeros(()))
    return exponent_of(torch.where(torch.isfinite(values), values.abs(), 0.0).amax())


def _range_scale(exponent: torch.Tensor) -> torch.Tensor:
    """`2**-e` (float64) of automatic-range exponents: a value times it lies in [-1, 1) within the range."""
    return torch.exp2(-exponent.clamp(min=EXPONENT_MIN).double())


def _codes(
    values: torch.Tensor,
    finite: torch.Tensor,
    bins: int,
    scale: torch.Tensor | None,
    bounds: tuple[float, float],
    out: torch.Tensor | None = None,
    index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Column of each value (int64): its bin, `bins` (underflow), `bins + 1` (overflow) or `bins + 2` (not finite,
    as `finite`, a 0/1 mask, says); over the automatic range whose `_range_scale` is `scale` (0-d or one per value),
    else over `bounds`. `out` (float, as `values`) and `index` (int64): buffers the automatic range's codes and the
    result are written into (fresh tensors without them)."""
    if scale is not None:  # automatic range: every finite value is inside [-2**e, 2**e)
        code = torch.nan_to_num(values, 0.0, 0.0, 0.0, out=out).mul_(scale).add_(1.0).mul_(bins / 2)
        code = code.floor_().clamp_(0, bins - 1).sub_(bins + 2).mul_(finite).add_(bins + 2)  # bins + 2: not counted
    else:  # fixed range: the bin whose edges (`fixed_edges`) hold the value, as numpy.histogram finds it
        low, high = bounds
        edges = _edges_on((float(low), float(high)), bins, values.device)
        code = ((values - low) / _step(bounds, bins)).floor_().nan_to_num_(bins - 1.0).clamp_(0, bins - 1)
        bin_index = code.long()
        code = code - (values < torch.take(edges, bin_index)).double()
        code = code + ((values >= torch.take(edges, bin_index + 1)) & (bin_index < bins - 1)).double()
        code = torch.where(values < low, float(bins), torch.where(values > high, float(bins + 1), code))
        code = torch.where(finite > 0, code, float(bins + 2))
    return code.long() if index is None else index.copy_(code)


@functools.lru_cache(maxsize=64)
def _edges_on(bounds: tuple[float, float], bins: int, device: torch.device) -> torch.Tensor:
    """`fixed_edges` on `device`, copied once (never written)."""
    return to_device(fixed_edges(bounds, bins), device)


def _step(bounds: tuple[float, float], bins: int) -> float:
    """The width of a bin of a fixed range (computed in halves when high - low overflows)."""
    low, high = bounds
    width = high - low
    return width / bins if math.isfinite(width) else 2 * ((high / 2 - low / 2) / bins)


def tally(index: torch.Tensor, length: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """`torch.bincount(index, weights, minlength=length)` of indices in `[0, length)`: the (length,) count (int64)
    or sum of `weights` (their dtype) at each index. bincount on the CPU; elsewhere an `index_add_` into zeros,
    because CUDA's bincount reads the indices' min and max on the host to size its result (two syncs)."""
    if index.device.type == "cpu":
        return torch.bincount(index, weights, minlength=length)
    return added_at(index, length, weights)


def added_at(index: torch.Tensor, length: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """`tally` off the CPU: 1 (or each weight) added at each index of `length` zeros, sized without a sync."""
    if weights is None:
        weights = torch.ones_like(index)
    return torch.zeros(length, dtype=weights.dtype, device=index.device).index_add_(0, index, weights)


def counts(
    values: torch.Tensor,
    finite: torch.Tensor,
    bins: int,
    exponent: torch.Tensor | None = None,
    bounds: tuple[float, float] = (0.0, 1.0),
    weight: torch.Tensor | float = 1.0,
) -> torch.Tensor:
    """Return the (bins + 2,) float64 counts of the finite `values` (float64, flat; `finite` their 0/1 mask):
    over the automatic range of `exponent` (a 0-d int64 tensor), or over `bounds` when `exponent` is `None`;
    each value counts `weight`."""
    code = _codes(values, finite, bins, None if exponent is None else _range_scale(exponent), bounds)
    if isinstance(weight, torch.Tensor):
        weights = weight.to(torch.float64).expand(values.shape)
    else:  # filled on the device: a tensor made from a number would be copied from the host (a sync on CUDA)
        weights = values.new_full((), weight, dtype=torch.float64).expand(values.shape)
    return tally(code, bins + 3, weights)[: bins + 2]


def segment_counts(
    values: torch.Tensor,
    finite: torch.Tensor,
    segment: torch.Tensor,
    groups: int,
    bins: int,
    exponents: torch.Tensor | None = None,
    bounds: tuple[float, float] = (0.0, 1.0),
    spread: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor] | None = None,
    work: Workspace | None = None,
) -> torch.Tensor:
    """Return the (groups, bins + 2) float64 counts of values in groups (`segment[i]`: the group of value `i`),
    each group over the automatic range of its exponent (`exponents`, (groups,) int64) or over `bounds`: one
    `bincount` for all of them. `spread(per_group, out)` repeats a (groups,) tensor over the values
    (`Segments.spread`; default: gathered by `segment`); `work`: where the temporaries go (flat buffers "scales",
    "codes" and "index"; fresh tensors without one)."""
    width = bins + 3  # the bins, below and above a fixed range, and not counted
    buffer = flat_buffers(values, work)
    scale = None
    if exponents is not None:
        scales = _range_scale(exponents)
        scale = spread(scales, buffer("scales")) if spread is not None else scales[segment]
    index = _codes(values, finite, bins, scale, bounds, buffer("codes"), buffer("index", torch.int64))
    index = index.add_(segment, alpha=width)  # group g's columns from g * width
    return tally(index, groups * width).view(groups, width)[:, : bins + 2].double()


def row_counts(
    values: torch.Tensor,
    finite: torch.Tensor,
    bins: int,
    exponents: torch.Tensor | None = None,
    bounds: tuple[float, float] = (0.0, 1.0),
) -> torch.Tensor:
    """Return the (rows, bins + 2) float64 counts of the rows of `values` ((rows, width) float32 samples;
    `finite` the 0/1 mask of the values counted), each row over the automatic range of its exponent
    (`exponents`, (rows,) int64) or over `bounds`: one `bincount` for all of them.

    The automatic range is binned in float32 (`floor(x * bins / 2**(e + 1)) + bins / 2`, one rounding): a sample
    is an estimate, and only a value within a float32 rounding of an edge can land in the neighbouring bin."""
    # equivalent mutant `3 -> 4`: any width above the largest code (bins + 2) keeps the rows' columns apart
    rows, width = values.shape[0], bins + 3  # the bins, below and above a fixed range, and not counted
    if exponents is None:
        code = _codes(values.double(), finite, bins, None, bounds).clamp_(max=bins + 2)
    else:
        half = bins // 2
        exponent = exponents.clamp(-149, 129)  # float32 values: rows outside hold only zeros
        first = exponent.div(2, rounding_mode="floor")
        ones = torch.ones(rows, dtype=torch.float32, device=values.device)
        # x * 2**-e in two exact steps (each power of two within float32), then * half: one rounding
        scales = torch.ldexp(ones, -first)[:, None], torch.ldexp(ones * half, first - exponent)[:, None]
        clean = torch.nan_to_num(values, 0.0, 0.0, 0.0)
        code = clean.mul_(scales[0]).mul_(scales[1]).floor_().add_(half).clamp_(0, bins - 1)
        code = code.sub_(bins + 2).mul_(finite)  # bins + 2 (once added) where not counted
        if rows * width <= EXACT_CODES:  # every code exact in float32: row r's columns, from r * width, added there
            offsets = torch.arange(rows, dtype=torch.float32, device=values.device).mul_(width).add_(bins + 2)
            index = code.add_(offsets[:, None]).int()  # (int32: half the bytes to write and count)
            return tally(index.reshape(-1), rows * width).view(rows, width)[:, : bins + 2].double()
        code = code.add_(bins + 2).long()
    code += torch.arange(rows, device=values.device)[:, None] * width
    counts = tally(code.reshape(-1), rows * width).view(rows, width)
    return counts[:, : bins + 2].double()


def rebin(hist: torch.Tensor, exponent: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Re-bin automatic-range counts (..., bins + 2) of exponents `exponent` (...) onto `target` (>= them): bin
    `i` moves to `floor((i - bins/2) / 2**(target - exponent)) + bins/2`. Exact (the edges nest)."""
    bins = hist.shape[-1] - 2
    half = bins // 2
    shift = (target - exponent).clamp(0, 62).unsqueeze(-1)
    offsets = torch.arange(bins, device=hist.device, dtype=torch.int64) - half
    moved = torch.bitwise_right_shift(offsets, shift) + half  # arithmetic shift: floor division by 2**shift
    out = torch.zeros_like(hist)
    out[..., :bins].scatter_add_(-1, moved.expand(hist[..., :bins].shape), hist[..., :bins])
    out[..., bins:] = hist[..., bins:]
    return out


def on_widest_range(hists: torch.Tensor, exponents: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Put automatic-range histograms on the widest range among them: the one rule by which histograms of
    different steps, records or ranks are brought together (exact: the edges nest).

    Args:
        hists: (..., bins + 2) counts, `exponents`' shape plus the counts' dimension.
        exponents: Their ranges' exponents.
        dim: The dimension of `exponents` whose histograms share one range.

    Returns:
        The counts re-binned onto the widest range (same shape), and that range's exponent (`exponents` without
        `dim`; `EXPONENT_NONE` where there is nothing).
    """
    if exponents.shape[dim] == 0:
        return hists, torch.full_like(exponents.sum(dim), EXPONENT_NONE)
    target = exponents.amax(dim, keepdim=True)
    return rebin(hists, exponents, target.expand_as(exponents)), target.squeeze(dim)


def widest_exponent(exponents: Iterable[int]) -> int:
    """The exponent of the widest of automatic ranges given as ints (`EXPONENT_NONE` for none): the range that
    `on_widest_range` puts histograms on, for merges that choose it from small headers before re-binning."""
    return max(exponents, default=EXPONENT_NONE)


def auto_edges(exponent: int, bins: int) -> torch.Tensor:
    """The (bins + 1,) float64 edges of the automatic range `2**exponent` (radius 1 for `EXPONENT_NONE`); edges
    beyond the largest float64 are shown as it."""
    exponent = 0 if exponent <= EXPONENT_NONE else exponent
    steps = torch.arange(bins + 1, dtype=torch.float64) * (2.0 / bins) - 1.0
    half = exponent // 2
    edges = steps * math.ldexp(1.0, half) * math.ldexp(1.0, exponent - half)
    largest = torch.finfo(torch.float64).max
    return edges.clamp(-largest, largest)


def exponent_of_edges(edges: torch.Tensor) -> int:
    """The exponent of the automatic range whose edges (`auto_edges`) are `edges`."""
    top = float(edges[-1])
    if top >= torch.finfo(torch.float64).max:
        return EXPONENT_MAX
    mantissa, exponent = math.frexp(top)  # top = 2**e = 0.5 * 2**(e + 1)
    return exponent - 1 if mantissa == 0.5 else EXPONENT_NONE


def fixed_edges(bounds: tuple[float, float], bins: int) -> torch.Tensor:
    """The (bins + 1,) float64 edges of a fixed range: `low + k * step` as numpy.histogram makes them, the last one
    exactly `high` (never overflowing, also for ranges near the float64 maximum)."""
    low, high = bounds
    edges = torch.arange(bins + 1, dtype=torch.float64) * _step(bounds, bins) + low
    edges[-1] = high
    return edges
