"""Turn recorded tables into `WatchResults`, and find where values first became non-finite."""

from __future__ import annotations

from typing import Any

import torch

from ._buffers import Chunk
from ._results import ACTIVATION_STATS, GRAD_STATS, WatchResults

__all__ = ["build_results", "first_nonfinite", "merge_first"]

_NONFINITE = ACTIVATION_STATS.index("nonfinite")


def build_results(
    table: Chunk | None,
    paths: list[str],
    kinds: list[str],
    param_names: list[str],
    groups: frozenset[str],
    with_hist: list[bool] | None = None,
) -> WatchResults:
    """Build the per-layer series of `WatchResults` from `table` (empty series when `table` is `None`)."""
    if table is None:
        table = _empty(len(paths), len(param_names))
    results = WatchResults(steps=table.steps.clone(), layers=dict(zip(paths, kinds, strict=True)))
    if "activations" in groups:
        results.activations = {p: _columns(table.activations[:, j], ACTIVATION_STATS) for j, p in enumerate(paths)}
    if "histograms" in groups:
        shown = with_hist or [True] * len(paths)
        results.histograms = {p: table.histograms[:, j].clone() for j, p in enumerate(paths) if shown[j]}
    if "output_grads" in groups:
        results.output_grads = {p: _columns(table.output_grads[:, j], GRAD_STATS) for j, p in enumerate(paths)}
    if "param_grads" in groups:
        results.param_grads = {n: _columns(table.param_grads[:, i], GRAD_STATS) for i, n in enumerate(param_names)}
    if "update_ratios" in groups:
        results.update_ratios = {n: table.update_ratios[:, i].clone() for i, n in enumerate(param_names)}
    if table.has_loss:
        results.losses = table.losses.clone()
    return results


def _columns(values: torch.Tensor, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {name: values[:, k].clone() for k, name in enumerate(names)}


def _empty(modules: int, params: int) -> Chunk:
    return Chunk(
        steps=torch.zeros(0, dtype=torch.int64),
        activations=torch.zeros(0, modules, len(ACTIVATION_STATS)),
        histograms=torch.zeros(0, modules, 0),
        output_grads=torch.zeros(0, modules, len(GRAD_STATS)),
        param_grads=torch.zeros(0, params, len(GRAD_STATS)),
        update_ratios=torch.zeros(0, params),
        losses=torch.zeros(0),
    )


def first_nonfinite(table: Chunk, paths: list[str], orders: tuple[list[int], list[int]]) -> dict[str, Any]:
    """Return `{"forward": {"path", "step"} or None, "backward": ...}` from the non-finite counts of `table`."""
    found: dict[str, Any] = {}
    columns = (table.activations[..., _NONFINITE], table.output_grads[..., GRAD_STATS.index("nonfinite")])
    for direction, counts, order in zip(("forward", "backward"), columns, orders, strict=True):
        bad = counts.nan_to_num(0.0) > 0  # (S, modules)
        rows = bad.any(dim=1).nonzero()
        if len(rows) == 0:
            found[direction] = None
            continue
        row = int(rows[0, 0])
        index = _earliest(bad[row].nonzero().flatten().tolist(), order)
        found[direction] = {"path": paths[index], "step": int(table.steps[row])}
    return found


def first_from_flags(first: torch.Tensor, paths: list[str], orders: tuple[list[int], list[int]]) -> dict[str, Any]:
    """Same as `first_nonfinite`, from the (2, modules) first-non-finite-step flags of unrecorded steps."""
    found: dict[str, Any] = {}
    for direction, steps, order in zip(("forward", "backward"), first.cpu(), orders, strict=True):
        hit = steps >= 0
        if not bool(hit.any()):
            found[direction] = None
            continue
        step = int(steps[hit].min())
        index = _earliest((steps == step).nonzero().flatten().tolist(), order)
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
