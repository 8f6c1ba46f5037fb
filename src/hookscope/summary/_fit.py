"""Fit a table into a terminal width: shorten names and paths, cut long text, never cut numbers. Pure functions.

`shorten_path` (from `hookscope._text`, the one rule plots, the report and the doctor use too) keeps the first
and the last segments of a dotted module path and elides the middle
(`encoder.…self_attn.out_proj`), or only the last ones (`…layers.3.mlp`) where the first is shown elsewhere (under a
tree); `shorten_middle` and `shorten_end` do the same for any text, and `shorten_end` never cuts through a number
or a word when it can stop before it (`[2, 8, 1000]` -> `[2, 8, …`). `fit_widths` decides
the width of every column: numbers keep their natural width, text columns shrink (widest first) down to soft
minimums, then low-priority columns are left out, then text shrinks to hard minimums. Nothing here knows about
summaries: the table renderers of other packages can use it as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._text import shorten_end, shorten_middle, shorten_path  # the one shortening rule, shared with plots

__all__ = ["ColumnFit", "FitResult", "fit_widths", "shorten_end", "shorten_middle", "shorten_path"]


@dataclass(frozen=True)
class ColumnFit:
    """How one column may fit: its natural width and, for text, how far it may shrink (`None`: never)."""

    natural: int
    soft_minimum: int | None = None
    hard_minimum: int | None = None


@dataclass(frozen=True)
class FitResult:
    """Widths of the kept columns (by index), the indices left out, and whether the table fits."""

    widths: dict[int, int]
    dropped: tuple[int, ...]
    fits: bool


def _shrink(columns: Sequence[ColumnFit], kept: list[int], budget: int, hard: bool) -> dict[int, int] | None:
    """Shrink the widest shrinkable columns one character at a time until the kept ones fit `budget`."""
    widths = {i: columns[i].natural for i in kept}
    floors = {}
    for i in kept:
        floor = columns[i].hard_minimum if hard else columns[i].soft_minimum
        if floor is not None:
            floors[i] = min(floor, columns[i].natural)
    excess = sum(widths.values()) - budget
    while excess > 0:
        room = [i for i in floors if widths[i] > floors[i]]
        if not room:
            return None
        widest = max(room, key=lambda i: (widths[i] - floors[i], -i))
        widths[widest] -= 1
        excess -= 1
    return widths


def fit_widths(columns: Sequence[ColumnFit], available: int, gap: int, drop_order: Sequence[int] = ()) -> FitResult:
    """Choose column widths so the table (columns plus `gap` characters between neighbours) fits `available`.

    First text columns shrink to their soft minimums; if that is not enough, the columns of `drop_order` are
    left out one by one (and the rest widen back); if still too wide, text shrinks to its hard minimums. Numbers
    (columns without minimums) always keep their natural width, so a table that cannot fit is reported
    (`fits=False`) rather than cutting one.

    Example:
        >>> fit_widths([ColumnFit(30, 12, 6), ColumnFit(10)], available=30, gap=2)
        FitResult(widths={0: 18, 1: 10}, dropped=(), fits=True)
    """
    kept = list(range(len(columns)))
    dropped: list[int] = []
    queue = [i for i in drop_order if i in kept]
    for hard in (False, True):
        while True:
            budget = available - gap * (len(kept) - 1)
            widths = _shrink(columns, kept, budget, hard)
            if widths is not None:
                return FitResult(widths, tuple(dropped), True)
            if hard or not queue:
                break
            victim = queue.pop(0)
            kept.remove(victim)
            dropped.append(victim)
    floors = {i: columns[i].hard_minimum for i in kept}
    return FitResult(
        {i: min(f, columns[i].natural) if f is not None else columns[i].natural for i, f in floors.items()},
        tuple(dropped),
        False,
    )
