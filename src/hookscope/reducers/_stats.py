"""Streaming summary statistics of every value pushed, by the engine's definitions (`hookscope.stats`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .._check import FINITE, NON_NEGATIVE, checked
from .._schema import FLOAT, Record, Tensor
from ..stats._describe import describe
from ..stats._record import RECORD, STATISTICS, combine, empty, finalize
from ..stats._spec import NEAR_ZERO, Spec, accumulate_dtype
from ._base import Reducer, move

__all__ = ["Stats", "StatsReducer"]


@dataclasses.dataclass(frozen=True)
class Stats:
    """Summary statistics of every finite value pushed; each field a 0-d float64 tensor on the reducer's device.

    `std` (and `var`, its square) has Bessel's correction and is 0 for a single value; `near_zero` is the
    fraction of values with |x| <= the reducer's `near_zero`; `count` counts the finite values and `nonfinite`
    the NaN and ±inf ones. With no finite value, every statistic but the counts is NaN.
    """

    count: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor
    std: torch.Tensor
    min: torch.Tensor
    max: torch.Tensor
    norm: torch.Tensor
    nonfinite: torch.Tensor
    near_zero: torch.Tensor

    def as_dict(self) -> dict[str, torch.Tensor]:
        """Return the fields by name."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


class StatsReducer(Reducer):
    """Count, mean, std, min, max, norm, near-zero fraction and non-finite count of every value pushed.

    Every element of every tensor pushed is one value: one push of a (B, C) activation adds B * C values. Each
    push is described exactly by `hookscope.stats.describe` and folded in by Chan's formulas
    (`hookscope.stats.combine`), so the statistics are those of every value pushed, by the definitions that
    `ActivationStats` and `watch()` report too: non-finite values are counted apart and never enter the others.
    `combine(other)` returns a new reducer holding both reducers' values, exactly as if all had been pushed into
    one.

    Args:
        near_zero: A value is near zero when |x| <= near_zero.

    Raises:
        ValueError: `near_zero` is not a finite number >= 0.

    Example:
        >>> import torch
        >>> stats = StatsReducer()
        >>> stats.push(torch.tensor([1.0, 2.0, float("nan")]))
        >>> stats.push(torch.tensor([3.0]))
        >>> summary = stats.peek()
        >>> int(summary.count), summary.mean.item(), summary.std.item(), int(summary.nonfinite)
        (3, 2.0, 1.0, 1)
    """

    STATE = Record(record=Tensor(FLOAT, shape=(len(RECORD),)))

    @checked(near_zero=(FINITE, NON_NEGATIVE))
    def __init__(self, near_zero: float = NEAR_ZERO) -> None:
        super().__init__()
        self.near_zero = float(near_zero)
        self._spec = Spec(near_zero=self.near_zero)
        self._record = empty()
        self._reset()

    def config(self) -> dict[str, Any]:
        """Return the constructor arguments."""
        return {"near_zero": self.near_zero}

    def peek(self) -> Stats | None:
        """Return the statistics so far, or `None` before the first push."""
        if self._pushes == 0:
            return None
        values = dict(zip(STATISTICS, finalize(self._record).unbind(-1), strict=True))
        count = values["count"]
        return Stats(
            count=count,
            mean=values["mean"],
            var=values["std"].square(),
            std=values["std"],
            min=values["min"],
            max=values["max"],
            norm=values["rms"].nan_to_num(0.0) * count.sqrt(),
            nonfinite=values["nonfinite"],
            near_zero=values["near_zero"],
        )

    def dump(self) -> Stats | None:
        """Return `peek()` with every field along a new first dimension of size 1 (the one summary kept)."""
        stats = self.peek()
        return None if stats is None else Stats(**{name: t.unsqueeze(0) for name, t in stats.as_dict().items()})

    def combine(self, other: StatsReducer) -> StatsReducer:
        """Return a new reducer holding this one's values and `other`'s (Chan's formulas), on this one's device.

        The statistics are those of every value pushed into either, as if all had been pushed into one reducer;
        neither input changes.

        Raises:
            TypeError: `other` is not a `StatsReducer`.
            ValueError: `other` has another `near_zero`.
        """
        self._check_other(other)
        combined = StatsReducer(self.near_zero).to(self.device)
        combined._fold(self)
        combined._fold(other)
        return combined

    def merge(self, other: StatsReducer) -> None:
        """Fold `other` into this reducer in place, exactly as if its values had been pushed here (the first
        releases' name; `combine` returns a new reducer and leaves both inputs unchanged).

        Raises:
            TypeError: `other` is not a `StatsReducer`.
            ValueError: `other` has another `near_zero`.
        """
        self._check_other(other)
        self._fold(other)

    def _check_other(self, other: object) -> None:
        if not isinstance(other, StatsReducer):
            raise TypeError(f"other must be a StatsReducer, got {type(other).__name__}")
        if other.near_zero != self.near_zero:
            raise ValueError(
                f"other must count near-zero values as this reducer does (near_zero={self.near_zero}), got "
                f"near_zero={other.near_zero}"
            )

    def _fold(self, other: StatsReducer) -> None:
        theirs = other.state_dict()
        with self._lock, torch.no_grad():
            self._record = combine(self._record, move(theirs["state"]["record"], self._device))
            self._pushes += theirs["pushes"]
            self._dropped += theirs["dropped"]

    def _push(self, tensors: tuple[torch.Tensor, ...]) -> None:
        for tensor in tensors:
            accumulate_dtype(tensor.dtype, tensor.device)  # refuses complex values, saying what to push instead
            if tensor.numel():
                self._record = combine(self._record, describe(tensor, self._spec).record)

    def _reset(self) -> None:
        self._record = empty(device=self._device)

    def _move(self, device: torch.device) -> None:
        self._record = move(self._record, device)

    def _state(self) -> dict[str, Any]:
        return {"record": self._record}

    def _load(self, state: dict[str, Any]) -> None:
        self._record = state["record"].clone()
