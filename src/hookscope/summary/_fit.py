"""Fit a table into a terminal width: shorten names and paths, cut long text, never cut numbers. Pure functions.

`shorten_path` keeps the first and the last segments of a dotted module path and elides the middle
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

__all__ = ["ColumnFit", "FitResult", "fit_widths", "shorten_end", "shorten_middle", "shorten_path"]


def _is_word(char: str) -> bool:
    return char.isalnum() or char in "_."


def shorten_end(text: str, width: int, ellipsis: str = "…") -> str:
    """Cut `text` to `width` characters, ending with `ellipsis` where it was cut.

    The cut moves back to the start of a number or word it would split (`[2, 8, 1000]` at 10 -> `[2, 8, …`),
    unless that leaves less than half the width.

    Example:
        >>> shorten_end("{logits: [2, 8, 1000]}", 18)
        '{logits: [2, 8, …'
    """
    if len(text) <= width:
        return text
    if width <= len(ellipsis):
        return text[:width]
    keep = width - len(ellipsis)
    head = text[:keep]
    if _is_word(text[keep]) and head and _is_word(head[-1]):
        trimmed = head.rstrip("".join({c for c in head if _is_word(c)}))
        if len(trimmed) >= keep // 2:
            head = trimmed
    return head + ellipsis


def shorten_middle(text: str, width: int, ellipsis: str = "…") -> str:
    """Cut the middle out of `text` so it fits `width` characters: `AdaptiveAvgPool2d` -> `Adapt…Pool2d`."""
    if len(text) <= width:
        return text
    if width <= len(ellipsis):
        return text[:width]
    keep = width - len(ellipsis)
    head = (keep + 1) // 2
    return text[:head] + ellipsis + text[len(text) - (keep - head) :]


def shorten_path(path: str, width: int, ellipsis: str = "…", sep: str = ".", keep_first: bool = True) -> str:
    """Shorten a dotted path to `width` characters, eliding whole segments first.

    The first segment and as many trailing segments as fit are kept (`encoder.…layers.3.mlp.fc1`); with
    `keep_first=False` only trailing segments (`…layers.3.mlp.fc1`), for paths whose head is shown elsewhere (the
    parent rows of a tree). A path whose last segment alone does not fit is cut in the middle of its characters.

    Example:
        >>> shorten_path("encoder.layers.11.attention.output.dense", 31)
        'encoder.…attention.output.dense'
        >>> shorten_path("encoder.layers.11.attention.output.dense", 30, keep_first=False)
        '…11.attention.output.dense'
    """
    if len(path) <= width:
        return path
    parts = path.split(sep)
    head = parts[0] + sep if keep_first and len(parts) > 2 else ""
    tail, kept = None, 0
    for keep in range(len(parts) - 1 - bool(head), 0, -1):
        candidate = head + ellipsis + sep.join(parts[-keep:])
        if len(candidate) <= width:
            tail, kept = candidate, keep
            break
    middle = shorten_middle(path, width, ellipsis)
    if tail is not None and (kept >= 2 or len(tail) >= width // 2 or not middle.endswith(sep + parts[-1])):
        return tail  # whole segments, unless one short segment is all that fits and a middle cut keeps it
    if tail is None and len(parts) > 1 and width > len(ellipsis) + 2 and not middle.endswith(sep + parts[-1]):
        return ellipsis + shorten_middle(parts[-1], width - len(ellipsis), ellipsis)
    return middle


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
