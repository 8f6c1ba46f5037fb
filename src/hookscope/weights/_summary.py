"""Print the layers whose weights changed most, with their statistics."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._check import checked

__all__ = ["format_weight_summary", "print_weight_summary"]

_EMPTY = "No weight changes to show."


@checked()
def print_weight_summary(
    weight_changes: Mapping[str, float], weight_stats: Mapping[str, Mapping[str, float]], top_k: int = 10
) -> None:
    """Print a table of the `top_k` layers with the largest change, largest first, with their statistics.

    `weight_changes` is path -> change (e.g. from `compute_weight_changes`); `weight_stats` is path -> dict of
    statistics (e.g. the `"stats"` of `add_weight_distribution_monitor`), shown as "-" where a layer has none.
    NaN changes rank first (they are the most urgent). With nothing to show, prints one line saying so.

    Raises:
        ValueError: `top_k` is not a positive int.
    """
    print(format_weight_summary(weight_changes, weight_stats, top_k))


@checked()
def format_weight_summary(
    weight_changes: Mapping[str, float], weight_stats: Mapping[str, Mapping[str, float]], top_k: int = 10
) -> str:
    """Return the text `print_weight_summary` prints."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
    ranked = sorted(weight_changes.items(), key=_rank)[:top_k]
    if not ranked:
        return _EMPTY
    columns = _stat_columns([weight_stats.get(path) or {} for path, _ in ranked])
    header = ["#", "layer", "change", *columns]
    rows = [header]
    for index, (path, change) in enumerate(ranked, start=1):
        stats = weight_stats.get(path) or {}
        rows.append([str(index), path or "(root)", _number(change), *(_cell(stats, c) for c in columns)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [_line(row, widths) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def _rank(item: tuple[str, float]) -> tuple[int, float]:
    value = float(item[1])
    return (0, 0.0) if math.isnan(value) else (1, -value)


def _stat_columns(all_stats: list[Mapping[str, Any]]) -> list[str]:
    preferred = ("mean", "std", "min", "max", "norm", "abs_mean", "zero_fraction")
    present = {key for stats in all_stats for key in stats}
    return [k for k in preferred if k in present] + sorted(present - set(preferred))


def _cell(stats: Mapping[str, Any], column: str) -> str:
    value = stats.get(column)
    return "-" if value is None else _number(value)


def _number(value: Any) -> str:
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)


def _line(row: list[str], widths: list[int]) -> str:
    return "  ".join(_align(cell, width, i) for i, (cell, width) in enumerate(zip(row, widths, strict=True)))


def _align(cell: str, width: int, index: int) -> str:
    return cell.ljust(width) if index == 1 else cell.rjust(width)
