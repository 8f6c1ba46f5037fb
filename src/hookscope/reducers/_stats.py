"""Streaming summary statistics (count, mean, variance, min, max, norm, non-finite count), mergeable by Chan."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .._check import checked
from .._schema import FLOAT, INT, Record, Tensor
from ._base import Reducer, accumulate_dtype, move, wide_dtype

__all__ = ["Stats", "StatsReducer"]

_FIELDS = ("count", "mean", "m2", "min", "max", "nonfinite")


@dataclasses.dataclass(frozen=True)
class Stats:
    """Summary statistics of every finite value pushed; each field a 0-d tensor on the reducer's device.

    `count` and `nonfinite` are int64; the others float64 (float32 on MPS). With no finite value, `mean`,
    `min` and `max` are NaN.
    """

    count: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor
    std: torch.Tensor
    min: torch.Tensor
    max: torch.Tensor
    norm: torch.Tensor
    nonfinite: torch.Tensor

    def as_dict(self) -> dict[str, torch.Tensor]:
        """Return the fields by name."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


class StatsReducer(Reducer):
    """Count, mean, variance (Welford's M2, combined by Chan's formulas), min, max and non-finite count.

    Every element of every tensor pushed is one value: one push of a (B, C) activation adds B * C values.
    Non-finite values (NaN, ±inf) are counted in `nonfinite` and left out of the other statistics, so one
    overflow does not poison the mean forever. A batch is summarised in float32 (float64 for float64 and
    integer inputs) and folded into float64 accumulators (float32 on MPS, which has no float64).
    `merge(other)` folds another reducer's state in exactly as if its values had been pushed here.

    Args:
        correction: Degrees of freedom subtracted from the count for the variance (0: population variance,
            defined for a single value; 1: Bessel's correction, NaN for fewer than 2 values).

    Raises:
        ValueError: `correction` is not a non-negative int.

    Example:
        >>> import torch
        >>> stats = StatsReducer()
        >>> stats.push(torch.tensor([1.0, 2.0, float("nan")]))
        >>> stats.push(torch.tensor([3.0]))
        >>> summary = stats.peek()
        >>> summary.count.item(), summary.mean.item(), summary.nonfinite.item()
        (3, 2.0, 1)
    """

    STATE = Record(
        count=Tensor(INT, shape=()),
        mean=Tensor(FLOAT, shape=()),
        m2=Tensor(FLOAT, shape=()),
        min=Tensor(FLOAT, shape=()),
        max=Tensor(FLOAT, shape=()),
        nonfinite=Tensor(INT, shape=()),
    )

    @checked()
    def __init__(self, correction: int = 0) -> None:
        if isinstance(correction, bool) or not isinstance(correction, int) or correction < 0:
            raise ValueError(f"correction must be a non-negative int, got {correction!r}")
        super().__init__()
        self.correction = correction
        self._acc: dict[str, torch.Tensor] = {}
        self._reset()

    def config(self) -> dict[str, Any]:
        """Return the constructor arguments."""
        return {"correction": self.correction}

    def peek(self) -> Stats | None:
        """Return the statistics so far, or `None` before the first push."""
        if self._pushes == 0:
            return None
        acc = self._acc
        count = acc["count"]
        n = count.to(acc["mean"].dtype)
        has = count > 0
        nan = torch.full_like(acc["mean"], float("nan"))
        var = torch.where(count > self.correction, acc["m2"] / (n - self.correction).clamp(min=1), nan)
        return Stats(
            count=count,
            mean=torch.where(has, acc["mean"], nan),
            var=var,
            std=var.sqrt(),
            min=torch.where(has, acc["min"], nan),
            max=torch.where(has, acc["max"], nan),
            norm=(acc["m2"] + n * acc["mean"].square()).clamp(min=0).sqrt(),
            nonfinite=acc["nonfinite"],
        )

    def dump(self) -> Stats | None:
        """Return `peek()` with every field along a new first dimension of size 1 (the one summary kept)."""
        stats = self.peek()
        return None if stats is None else Stats(**{name: t.unsqueeze(0) for name, t in stats.as_dict().items()})

    def merge(self, other: StatsReducer) -> None:
        """Fold `other`'s values into this reducer (Chan et al.), as if they had been pushed here.

        Raises:
            TypeError: `other` is not a `StatsReducer`.
        """
        if not isinstance(other, StatsReducer):
            raise TypeError(f"other must be a StatsReducer, got {type(other).__name__}")
        theirs = other.state_dict()
        with self._lock, torch.no_grad():
            incoming = {name: move(tensor, self._device) for name, tensor in theirs["state"].items()}
            self._acc = _combine(self._acc, incoming)
            self._pushes += theirs["pushes"]
            self._dropped += theirs["dropped"]

    def _push(self, tensors: tuple[torch.Tensor, ...]) -> None:
        for tensor in tensors:
            if tensor.numel():
                self._acc = _combine(self._acc, _summarise(tensor.reshape(-1)))

    def _reset(self) -> None:
        wide = wide_dtype(self._device)
        zero = torch.zeros((), dtype=torch.int64)
        self._acc = {
            "count": zero,
            "mean": torch.zeros((), dtype=wide),
            "m2": torch.zeros((), dtype=wide),
            "min": torch.full((), float("inf"), dtype=wide),
            "max": torch.full((), float("-inf"), dtype=wide),
            "nonfinite": zero.clone(),
        }

    def _move(self, device: torch.device) -> None:
        self._acc = {name: move(tensor, device) for name, tensor in self._acc.items()}

    def _state(self) -> dict[str, Any]:
        return dict(self._acc)

    def _load(self, state: dict[str, Any]) -> None:
        self._acc = {name: state[name].clone() for name in _FIELDS}


def _summarise(values: torch.Tensor) -> dict[str, torch.Tensor]:
    """Statistics of the finite entries of a non-empty 1-D tensor, without leaving the device.

    Non-finite entries are zeroed with `nan_to_num` rather than masked with `isfinite`, which is several times
    slower on CPU; each zeroed entry adds `mean**2` to the sum of squared deviations, which is taken back.
    """
    values = values.to(accumulate_dtype(values.dtype, values.device))
    clean = torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
    nonfinite = torch.count_nonzero(values - clean)  # NaN or ±inf exactly where the entry is not finite
    count = values.numel() - nonfinite
    mean = clean.sum() / count.clamp(min=1)
    deviation = clean - mean
    inf = float("inf")
    return {
        "count": count,
        "mean": mean,
        "m2": (torch.dot(deviation, deviation) - nonfinite * mean.square()).clamp(min=0),
        "min": torch.nan_to_num(values, nan=inf, posinf=inf, neginf=inf).amin(),
        "max": torch.nan_to_num(values, nan=-inf, posinf=-inf, neginf=-inf).amax(),
        "nonfinite": nonfinite,
    }


def _combine(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Chan's parallel update: the statistics of the union of two sets of values."""
    wide = a["mean"].dtype
    count = a["count"] + b["count"]
    n_a, n_b = a["count"].to(wide), b["count"].to(wide)
    n = count.to(wide).clamp(min=1)
    delta = b["mean"].to(wide) - a["mean"]
    return {
        "count": count,
        "mean": a["mean"] + delta * (n_b / n),
        "m2": a["m2"] + b["m2"].to(wide) + delta.square() * (n_a * n_b / n),
        "min": torch.minimum(a["min"], b["min"].to(wide)),
        "max": torch.maximum(a["max"], b["max"].to(wide)),
        "nonfinite": a["nonfinite"] + b["nonfinite"],
    }
