"""Histograms of every value pushed, over a fixed range or an automatic symmetric one that grows exactly."""

from __future__ import annotations

import math
from typing import Any

import torch

from .._check import checked
from .._schema import FLOAT, INT, Record, Tensor
from ._base import Reducer, accumulate_dtype, move, wide_dtype

__all__ = ["HistogramReducer"]


class HistogramReducer(Reducer):
    """Count every value pushed into `bins` equal bins; negative values are kept (unlike fastai's).

    With a fixed `range=(low, high)`, bins are `[edge_i, edge_i+1)` with the last one closed, as in
    `numpy.histogram`; values outside are counted in `underflow` / `overflow`. With `range=None` the range is
    symmetric, `[-radius, radius)`, where `radius` is the smallest power of two strictly above the largest
    absolute value seen (1 while only zeros were seen). When a push needs a wider range the radius doubles as
    often as needed and the old counts are merged pairwise into the new bins; since the edges nest, the counts
    are exactly those of a histogram made at the end with the final edges. Non-finite values are counted in
    `nonfinite` and in no bin. Everything stays on the device: no sync per push.

    Args:
        bins: Number of bins (even when `range` is `None`, so that the edges nest).
        range: `(low, high)` with `low < high`, both finite, or `None` for the automatic range.

    Raises:
        ValueError: `bins` is not a positive int (even for the automatic range), or `range` is not a valid pair.

    Example:
        >>> import torch
        >>> histogram = HistogramReducer(bins=4)
        >>> histogram.push(torch.tensor([-1.5, -0.5, 0.25, 1.0]))
        >>> histogram.peek().tolist(), histogram.edges().tolist()
        ([1, 1, 1, 1], [-2.0, -1.0, 0.0, 1.0, 2.0])
    """

    STATE = Record(
        counts=Tensor(INT, shape=("bins",)),
        radius=Tensor(FLOAT, shape=()),
        underflow=Tensor(INT, shape=()),
        overflow=Tensor(INT, shape=()),
        nonfinite=Tensor(INT, shape=()),
    )

    @checked()
    def __init__(self, bins: int, range: tuple[float, float] | None = None) -> None:
        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1 or (range is None and bins % 2):
            rule = (
                "a positive even int (the automatic range doubles symmetrically)" if range is None else "a positive int"
            )
            raise ValueError(f"bins must be {rule}, got {bins!r}")
        if range is not None and not _valid_range(range):
            raise ValueError(
                f"range must be a pair (low, high) of finite numbers with low < high, or None, got {range!r}"
            )
        super().__init__()
        self.bins = bins
        self.bounds = None if range is None else (float(range[0]), float(range[1]))
        self._acc: dict[str, torch.Tensor] = {}
        self._reset()

    def config(self) -> dict[str, Any]:
        """Return the constructor arguments."""
        return {"bins": self.bins, "range": None if self.bounds is None else list(self.bounds)}

    @property
    def underflow(self) -> torch.Tensor:
        """How many finite values fell below a fixed range (always 0 for the automatic range)."""
        return self._acc["underflow"]

    @property
    def overflow(self) -> torch.Tensor:
        """How many finite values fell above a fixed range (always 0 for the automatic range)."""
        return self._acc["overflow"]

    @property
    def nonfinite(self) -> torch.Tensor:
        """How many NaN and ±inf values were pushed (counted in no bin)."""
        return self._acc["nonfinite"]

    def edges(self) -> torch.Tensor:
        """Return the `bins + 1` bin edges, in the state's float dtype, on the state's device."""
        if self.bounds is None:
            radius = self._effective_radius()
            low, high = -radius, radius
        else:
            low, high = (torch.tensor(b, dtype=self._acc["radius"].dtype, device=self._device) for b in self.bounds)
        steps = torch.arange(self.bins + 1, dtype=low.dtype, device=self._device)
        edges = low + steps * ((high - low) / self.bins)
        return torch.cat([edges[:-1], high.reshape(1)])

    def peek(self) -> torch.Tensor | None:
        """Return the int64 counts per bin, or `None` before the first push."""
        return None if self._pushes == 0 else self._acc["counts"]

    def dump(self) -> torch.Tensor | None:
        """Return the counts along a new first dimension of size 1 (the one histogram kept)."""
        counts = self.peek()
        return None if counts is None else counts.unsqueeze(0)

    def _push(self, tensors: tuple[torch.Tensor, ...]) -> None:
        for tensor in tensors:
            if tensor.numel():
                self._count(tensor.reshape(-1))

    def _count(self, values: torch.Tensor) -> None:
        accumulate_dtype(values.dtype, values.device)  # refuses complex values
        values = values.to(self._acc["radius"].dtype)
        # Non-finite entries are zeroed (nan_to_num is several times faster than an isfinite mask on CPU),
        # binned like zeros, then taken back out of wherever a zero falls.
        clean = torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
        nonfinite = torch.count_nonzero(values - clean)
        self._acc["nonfinite"] = self._acc["nonfinite"] + nonfinite
        if self.bounds is None:
            self._grow(torch.maximum(clean.amax(), -clean.amin()))
        ones = torch.ones((), dtype=torch.int64, device=clean.device)
        self._add(clean, ones.expand(clean.shape))
        self._add(clean.new_zeros(1), -nonfinite.reshape(1))

    def _add(self, values: torch.Tensor, weights: torch.Tensor) -> None:
        """Add `weights` to the bins (or the under/overflow counts) that `values` fall in."""
        acc = self._acc
        if self.bounds is None:
            radius = self._effective_radius()
            scaled = (values + radius) * (self.bins / (2 * radius))  # exact scale: the radius is a power of two
        else:
            low, high = self.bounds
            scaled = (values - low) * (self.bins / (high - low))  # as numpy.histogram computes it
            below, above = values < low, values > high
            acc["underflow"] = acc["underflow"] + (weights * below).sum()
            acc["overflow"] = acc["overflow"] + (weights * above).sum()
            weights = weights * ~(below | above)
        index = scaled.clamp_(0, self.bins - 1).long()  # truncation is floor here: scaled >= 0 after the clamp
        acc["counts"] = acc["counts"].index_add(0, index, weights)

    def _grow(self, largest: torch.Tensor) -> None:
        """Widen the radius to a power of two above `largest`, merging old bins into the wider ones they nest in."""
        radius = self._acc["radius"]
        needed = torch.exp2(torch.floor(torch.log2(largest)) + 1)
        needed = torch.where(needed <= largest, 2 * needed, needed)
        new_radius = torch.maximum(radius, torch.where(largest > 0, needed, torch.zeros_like(needed)))
        scale = torch.where(radius > 0, new_radius / radius.clamp(min=torch.finfo(radius.dtype).tiny), math.inf)
        half = self.bins // 2
        offsets = torch.arange(self.bins, device=self._device, dtype=radius.dtype) - half
        target = (half + torch.floor(offsets / scale)).long()
        self._acc["counts"] = torch.zeros_like(self._acc["counts"]).index_add(0, target, self._acc["counts"])
        self._acc["radius"] = new_radius

    def _effective_radius(self) -> torch.Tensor:
        radius = self._acc["radius"]
        return torch.where(radius > 0, radius, torch.ones_like(radius))

    def _reset(self) -> None:
        zero = torch.zeros((), dtype=torch.int64)
        self._acc = {
            "counts": torch.zeros(self.bins, dtype=torch.int64),
            "radius": torch.zeros((), dtype=wide_dtype(self._device)),
            "underflow": zero,
            "overflow": zero.clone(),
            "nonfinite": zero.clone(),
        }

    def _move(self, device: torch.device) -> None:
        self._acc = {name: move(tensor, device) for name, tensor in self._acc.items()}

    def _state(self) -> dict[str, Any]:
        return dict(self._acc)

    def _sizes(self) -> dict[str, int]:
        return {"bins": self.bins}

    def _load(self, state: dict[str, Any]) -> None:
        self._acc = {name: state[name].clone() for name in ("counts", "radius", "underflow", "overflow", "nonfinite")}


def _valid_range(bounds: Any) -> bool:
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        return False
    if not all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in bounds):
        return False
    return bool(bounds[0] < bounds[1])
