"""Histograms of every value pushed, by the engine's one kernel and range policy (`hookscope.stats`)."""

from __future__ import annotations

from typing import Any

import torch

from .._check import checked
from .._schema import FLOAT, INT, Record, Tensor
from ..stats._histogram import (
    EXPONENT_NONE,
    OVERFLOW,
    UNDERFLOW,
    auto_edges,
    check_bins,
    check_range,
    counts,
    fixed_edges,
    on_widest_range,
    range_exponent,
)
from ..stats._spec import accumulate_dtype
from ._base import Reducer, move

__all__ = ["HistogramReducer"]


class HistogramReducer(Reducer):
    """Count every value pushed into `bins` equal bins; negative values are kept (unlike fastai's).

    With `range=None` the range is symmetric, `[-2**e, 2**e)`, where `2**e` is the smallest power of two
    strictly above the largest finite magnitude seen (1 while only zeros were seen). When a push needs a wider
    range it widens and the old counts are merged into the wider bins they nest in, so the counts are exactly
    those of a histogram made at the end with the final edges: nothing is ever clamped into an end bin. With a
    fixed `range=(low, high)`, bins are `[edge_i, edge_i+1)` with the last one closed, as in `numpy.histogram`,
    and values outside are counted in `underflow` / `overflow`. Non-finite values are counted in `nonfinite` and
    in no bin. Everything stays on the device: no sync per push.

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
        counts=Tensor(FLOAT, shape=("bins+2",)),
        exponent=Tensor(INT, shape=()),
        nonfinite=Tensor(INT, shape=()),
    )

    @checked()
    def __init__(self, bins: int, range: tuple[float, float] | None = None) -> None:
        self.bounds = check_range("range", range)
        self.bins = check_bins("bins", bins, automatic=self.bounds is None)
        super().__init__()
        self._acc: dict[str, torch.Tensor] = {}
        self._reset()

    def config(self) -> dict[str, Any]:
        """Return the constructor arguments."""
        return {"bins": self.bins, "range": None if self.bounds is None else list(self.bounds)}

    @property
    def underflow(self) -> torch.Tensor:
        """How many finite values fell below a fixed range (always 0 for the automatic range), int64."""
        return self._acc["counts"][UNDERFLOW].long()

    @property
    def overflow(self) -> torch.Tensor:
        """How many finite values fell above a fixed range (always 0 for the automatic range), int64."""
        return self._acc["counts"][OVERFLOW].long()

    @property
    def nonfinite(self) -> torch.Tensor:
        """How many NaN and ±inf values were pushed (counted in no bin), int64."""
        return self._acc["nonfinite"]

    def edges(self) -> torch.Tensor:
        """Return the `bins + 1` float64 bin edges, on the CPU (reading the automatic range syncs once)."""
        if self.bounds is not None:
            return fixed_edges(self.bounds, self.bins)
        return auto_edges(int(self._acc["exponent"]), self.bins)

    def peek(self) -> torch.Tensor | None:
        """Return the int64 counts per bin, or `None` before the first push."""
        return None if self._pushes == 0 else self._acc["counts"][: self.bins].long()

    def dump(self) -> torch.Tensor | None:
        """Return the counts along a new first dimension of size 1 (the one histogram kept)."""
        hist = self.peek()
        return None if hist is None else hist.unsqueeze(0)

    def _push(self, tensors: tuple[torch.Tensor, ...]) -> None:
        for tensor in tensors:
            accumulate_dtype(tensor.dtype, tensor.device)  # refuses complex values, saying what to push instead
            if tensor.numel():
                self._count(tensor.reshape(-1).double())

    def _count(self, values: torch.Tensor) -> None:
        acc = self._acc
        finite = torch.isfinite(values)
        acc["nonfinite"] = acc["nonfinite"] + (~finite).sum()
        finite_mask = finite.double()
        if self.bounds is not None:
            acc["counts"] = acc["counts"] + counts(values, finite_mask, self.bins, None, self.bounds)
            return
        exponent = range_exponent(values)
        new = counts(values, finite_mask, self.bins, exponent)
        both, target = on_widest_range(torch.stack((acc["counts"], new)), torch.stack((acc["exponent"], exponent)))
        acc["counts"], acc["exponent"] = both.sum(0), target

    def _reset(self) -> None:
        self._acc = {
            "counts": torch.zeros(self.bins + 2, dtype=torch.float64, device=self._device),
            "exponent": torch.full((), EXPONENT_NONE, dtype=torch.int64, device=self._device),
            "nonfinite": torch.zeros((), dtype=torch.int64, device=self._device),
        }

    def _move(self, device: torch.device) -> None:
        self._acc = {name: move(tensor, device) for name, tensor in self._acc.items()}

    def _state(self) -> dict[str, Any]:
        return dict(self._acc)

    def _sizes(self) -> dict[str, int]:
        return {"bins": self.bins}

    def _load(self, state: dict[str, Any]) -> None:
        self._acc = {name: state[name].clone() for name in ("counts", "exponent", "nonfinite")}
