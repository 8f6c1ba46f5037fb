"""Where non-finite values first appeared: per direction (forward outputs, backward output gradients), the module
and step where a non-finite value was first seen, from recorded steps' counts or from unrecorded steps' flags.

Within a step, the module that ran first (in the order modules ran, forward or backward) is named: a NaN made in
layer k propagates to k+1, ..., so the earliest is its producer. A module called several times in a step (a shared
activation) is ranked, forward, by its first call whose output was not finite where the steps say which (recorded
and checked steps, `hookscope.watch._call_log`), else by its first call.
"""

from __future__ import annotations

from typing import Any

import torch

from ._results import ACTIVATION_STATS, GRAD_STATS

__all__ = ["UNPLACED", "first_from_flags", "first_nonfinite", "merge_first"]

_NONFINITE = ACTIVATION_STATS.index("nonfinite")
UNPLACED = 1 << 62
"""The place in a forward of a call whose place is not known (later than every place)."""


def first_nonfinite(
    table: Any,
    paths: list[str],
    orders: tuple[list[int], list[int]],
    calls: list[dict[int, int]] | None = None,
) -> dict[str, Any]:
    """Return `{"forward": {"path", "step"} or None, "backward": ...}` from the non-finite counts of `table`.

    `calls`: per row of `table`, the place in a forward of each module's first call whose output was not finite
    (`CallLog.take`); forward, the candidates are ranked by it when each has one, else by `orders`."""
    found: dict[str, Any] = {}
    columns = (table.activations[..., _NONFINITE], table.output_grads[..., GRAD_STATS.index("nonfinite")])
    for direction, counts, order in zip(("forward", "backward"), columns, orders, strict=True):
        bad = counts.nan_to_num(0.0) > 0  # (S, modules)
        rows = bad.any(dim=1).nonzero()
        if len(rows) == 0:
            found[direction] = None
            continue
        row = int(rows[0, 0])
        places = calls[row] if calls is not None and direction == "forward" else None
        index = _first_of(bad[row].nonzero().flatten().tolist(), order, places)
        found[direction] = {"path": paths[index], "step": int(table.steps[row])}
    return found


def first_from_flags(
    first: torch.Tensor,
    paths: list[str],
    orders: tuple[list[int], list[int]],
    places: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Same as `first_nonfinite`, from the (2, modules) first-non-finite-step flags of unrecorded steps and, forward,
    the (modules,) place in a forward of each module's first non-finite call in that step (`places`; `UNPLACED`
    where unknown)."""
    found: dict[str, Any] = {}
    where = None if places is None else {j: p for j, p in enumerate(places.tolist()) if p < UNPLACED}
    for direction, steps, order in zip(("forward", "backward"), first.cpu(), orders, strict=True):
        hit = steps >= 0
        if not bool(hit.any()):
            found[direction] = None
            continue
        step = int(steps[hit].min())
        candidates = (steps == step).nonzero().flatten().tolist()
        index = _first_of(candidates, order, where if direction == "forward" else None)
        found[direction] = {"path": paths[index], "step": step}
    return found


def merge_first(*sources: dict[str, Any]) -> dict[str, Any]:
    """Keep, per direction, the earliest of several `first_nonfinite` answers."""
    merged: dict[str, Any] = {"forward": None, "backward": None}
    for source in sources:
        for direction, hit in source.items():
            if hit is not None and (merged[direction] is None or hit["step"] < merged[direction]["step"]):
                merged[direction] = hit
    return merged


def _earliest(candidates: list[int], order: list[int]) -> int:
    """The candidate module that fired first (by `order`); modules that never fired come last, in model order."""
    rank = {index: position for position, index in enumerate(order)}
    return min(candidates, key=lambda index: (rank.get(index, len(order) + index), index))


def _first_of(candidates: list[int], order: list[int], places: dict[int, int] | None) -> int:
    """The candidate module named: the one whose place in a forward (`places`: of its first non-finite call) comes
    first when every candidate has one, else the one that fired first (`_earliest`)."""
    if places is None or any(index not in places for index in candidates):
        return _earliest(candidates, order)
    return min(candidates, key=lambda index: (places[index], index))
