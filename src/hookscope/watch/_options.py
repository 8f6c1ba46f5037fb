"""The options of `watch()`, checked once with messages that say how to fix them."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..stats import check_bins, check_range

__all__ = ["GROUPS", "WatchOptions"]

GROUPS = (
    "activations",
    "histograms",
    "output_grads",
    "param_grads",
    "update_ratios",
    "unit_activity",
    "identical_units",
)
"""What `watch()` can collect, named after the `WatchResults` fields they fill (all by default)."""


@dataclass(frozen=True)
class WatchOptions:
    """Validated options of one `Watch` (see `watch()` for their meaning)."""

    every: int = 1
    train_only: bool = True
    groups: frozenset[str] = frozenset(GROUPS)
    capacity: int | None = 1024
    buffer_steps: int = 64
    hist_bins: int = 40
    hist_range: tuple[float, float] | None = None
    near_zero: float = 1e-3
    check_nonfinite: bool = True
    doctor: bool = False
    doctor_every: int = 100
    exact: bool = False

    @classmethod
    def build(
        cls,
        *,
        every: int,
        train_only: bool,
        groups: Iterable[str],
        capacity: int | None,
        buffer_steps: int,
        hist_bins: int,
        hist_range: tuple[float, float] | None,
        near_zero: float,
        check_nonfinite: bool,
        doctor: bool,
        doctor_every: int,
        exact: bool = False,
    ) -> WatchOptions:
        """Check every option and return them.

        Raises:
            ValueError: an option is out of range (the message names it and says what it accepts).
            TypeError: `groups` is a single string instead of a collection of names.
        """
        _positive("every", every)
        _positive("buffer_steps", buffer_steps)
        _positive("hist_bins", hist_bins)
        _positive("doctor_every", doctor_every)
        if capacity is not None:
            _positive("capacity", capacity, " or None (keep every recorded step)")
        chosen = _groups(groups)
        hist_range = check_range("hist_range", hist_range)
        check_bins("hist_bins", hist_bins, automatic=hist_range is None)
        if not (isinstance(near_zero, (int, float)) and math.isfinite(near_zero) and near_zero >= 0):
            raise ValueError(f"near_zero must be a finite number >= 0, got {near_zero!r}")
        return cls(
            every, bool(train_only), chosen, capacity, buffer_steps, hist_bins, hist_range, float(near_zero),
            bool(check_nonfinite), bool(doctor), doctor_every, bool(exact),
        )  # fmt: skip


def _positive(name: str, value: object, alternative: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int{alternative}, got {value!r}")


def _groups(groups: Iterable[str]) -> frozenset[str]:
    if isinstance(groups, str):
        raise TypeError(f"groups must be a collection of group names such as ({groups!r},), got the string {groups!r}")
    chosen = frozenset(groups)
    unknown = sorted(chosen - set(GROUPS))
    if unknown:
        raise ValueError(f"groups must be names from {GROUPS}, got unknown {unknown}")
    return chosen
