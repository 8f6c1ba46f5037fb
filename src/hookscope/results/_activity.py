"""What counts as a dead unit in `WatchResults.unit_activity`: one definition for the doctor and the plots."""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["DEAD_UNIT_ACTIVITY", "UnitCounts", "count_inactive_units"]

DEAD_UNIT_ACTIVITY = 0.01
"""A unit active (output > 0) less than this fraction of the time is (mostly) dead: it passes (almost) no
gradient, so it (almost) never learns. Units with no activity at all are counted apart as never active."""


class UnitCounts(NamedTuple):
    """Units of one layer: how many were observed, active less than the threshold, never active."""

    units: int
    inactive: int
    never: int

    @property
    def fraction(self) -> float:
        """`inactive / units` (0 for a layer with no observed unit)."""
        return self.inactive / self.units if self.units else 0.0


def count_inactive_units(activity: torch.Tensor, below: float = DEAD_UNIT_ACTIVITY) -> UnitCounts:
    """Count the units of `activity` (fractions of time each unit was > 0) active `< below`, and never active.

    Non-finite entries (a unit never observed) are left out. The comparison is made in `activity`'s own dtype, so a
    unit recorded as active exactly `below` of the time (in float32) is not counted.

    Example:
        >>> count_inactive_units(torch.tensor([0.0, 0.005, 0.5, float("nan")]))
        UnitCounts(units=3, inactive=2, never=1)
    """
    values = activity.detach().to("cpu").reshape(-1)
    values = values if values.is_floating_point() else values.float()
    values = values[torch.isfinite(values)]
    return UnitCounts(int(values.numel()), int((values < below).sum()), int((values <= 0).sum()))
