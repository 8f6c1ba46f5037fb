"""Unit activity: how often each output unit (channel, feature) of a layer is active (> 0).

Units are the channels (dim 1) of 4-D and 5-D outputs and of convolution and normalization layers, the last dim
otherwise (the features of a linear layer, of a transformer's (B, T, C) output). A value is active when it is
finite and > 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ._describe import Described
from ._histogram import tally

__all__ = ["UnitCounts", "active", "unit_counts", "unit_dims"]

_CHANNEL_FIRST = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    nn.GroupNorm,
)


def unit_dims(module: nn.Module | None, ndim: int) -> tuple[int, tuple[int, ...]] | None:
    """Return `(unit dim, dims to reduce)` of an output of `ndim` dims of `module`, or `None` below 2 dims."""
    if ndim < 2:
        return None
    unit = 1 if ndim >= 4 or isinstance(module, _CHANNEL_FIRST) else ndim - 1
    return unit, tuple(d for d in range(ndim) if d != unit)


def active(values: torch.Tensor) -> torch.Tensor:
    """1.0 where a value is active (finite and > 0; NaN never is), else 0.0, in `values`' float dtype (float64 for
    an integer tensor)."""
    if not values.is_floating_point():
        return (values > 0).double()
    return torch.nan_to_num(values, 0.0, 0.0, 0.0).sign_().clamp_(min=0.0)  # three cheap passes, no bool tensor


def unit_counts(described: Described, shape: tuple[int, ...], unit: int) -> torch.Tensor:
    """The (shape[unit],) float64 number of active values of each unit of the tensor `described` describes
    (estimated from its sample when it was sampled: each sampled value stands for numel / sample size)."""
    units = shape[unit]
    values = described.values
    if described.index is None:
        reduce = tuple(d for d in range(len(shape)) if d != unit)
        return active(values.view(shape)).sum(dim=reduce).double()
    inner = math.prod(shape[unit + 1 :])
    ids = torch.div(described.index, inner, rounding_mode="floor").remainder_(units)
    weight = math.prod(shape) / values.numel()
    return tally(ids, units, active(values).double() * weight)


class UnitCounts:
    """The active values and the values seen of every unit of every key, in two flat float64 tensors (position 0
    absorbs values of no unit): a unit's activity is their ratio. A sampled value counts the values it stands for
    in both, so a unit always active is exactly 1 and a dead one exactly 0, whatever its share of the sample."""

    def __init__(self, keys: int) -> None:
        self.keys = keys
        self.active: torch.Tensor | None = None
        self.seen: torch.Tensor | None = None
        self.slots: list[tuple[int, int] | None] = [None] * keys  # (start, units)
        self.mismatch = 0  # observations whose number of units differs from the key's first one

    def slot(self, key: int, units: int, device: torch.device) -> int | None:
        """The first position of `key`'s counts (allocated once); `None` (counted) if its number of units changed."""
        slot = self.slots[key]
        if slot is not None:
            if slot[1] != units:
                self.mismatch += 1
                return None
            return slot[0]
        start = 1 + sum(s[1] for s in self.slots if s is not None)
        self.slots[key] = (start, units)
        size = start + units
        if self.active is None or self.seen is None or self.active.numel() < size:
            grown = torch.zeros(2, max(2 * size, 64), dtype=torch.float64, device=device)
            if self.active is not None and self.seen is not None:
                grown[0, : self.active.numel()] = self.active.to(device)
                grown[1, : self.seen.numel()] = self.seen.to(device)
            self.active, self.seen = grown[0], grown[1]
        return start

    def add(self, positions: torch.Tensor, active: torch.Tensor, seen: torch.Tensor | float) -> None:
        """Add `active` (and `seen`) values at `positions` of the flat counts (float32 weights, as samples have,
        are summed by `bincount` over the whole table, then added)."""
        if self.active is not None and self.seen is not None and active.dtype != self.active.dtype:
            size = self.active.numel()
            self.active += tally(positions, size, active)
            weights = seen if isinstance(seen, torch.Tensor) else torch.full_like(active, seen)
            self.seen += tally(positions, size, weights)
            return
        if self.active is not None and self.seen is not None:
            self.active.index_add_(0, positions, active)
            if isinstance(seen, torch.Tensor):
                self.seen.index_add_(0, positions, seen)
            else:
                self.seen.index_add_(0, positions, torch.full_like(active, seen))

    def add_whole(
        self, positions: torch.Tensor, active: torch.Tensor, units: torch.Tensor, sizes: torch.Tensor
    ) -> None:
        """Add tensors read whole: `active` (float64, one per value) at `positions` (each value's position), and
        `sizes` values seen at the positions `units` (each position once, with how many values it has: what
        `positions` counts, known from the layout, so not counted again value by value)."""
        if self.active is not None and self.seen is not None:
            self.active.index_add_(0, positions, active)
            self.seen.index_add_(0, units, sizes)

    def fractions(self) -> list[torch.Tensor | None]:
        """Per key, the fraction of its observed values that were active, per unit (`None` before any)."""
        return [None if span is None else span[0] / span[1].clamp(min=1e-300) for span in self._spans()]

    def state(self) -> list[torch.Tensor | None]:
        """Per key, its (2, units) active and seen values per unit on the CPU (`None` before any)."""
        return [None if span is None else torch.stack(span).cpu() for span in self._spans()]

    def _spans(self) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Per key, its units' active and seen values (views; `None` before any)."""
        active, seen = self.active, self.seen
        if active is None or seen is None:
            return [None] * len(self.slots)
        return [
            None if slot is None else (active[slot[0] : slot[0] + slot[1]], seen[slot[0] : slot[0] + slot[1]])
            for slot in self.slots
        ]

    def load(self, counts: list[torch.Tensor | None], device: torch.device) -> None:
        """Replace everything by what `state` returned."""
        self.active, self.seen, self.slots = None, None, [None] * self.keys
        for key, found in enumerate(counts):
            # equivalent mutant `-x -> x`: `found` is (2, units) as `state` returns it, so shape[1] is shape[-1]
            start = None if found is None else self.slot(key, found.shape[-1], device)
            if found is not None and start is not None and self.active is not None and self.seen is not None:
                # equivalent mutant `-x -> x`: as above (shape[1] is shape[-1])
                self.active[start : start + found.shape[-1]] = found[0].to(self.active)
                # equivalent mutant `-x -> x`: as above
                self.seen[start : start + found.shape[-1]] = found[1].to(self.seen)
