"""Helpers shared by the checks: forward order of layers, step lookup, NaN-aware windowed medians, gradient tables."""

from __future__ import annotations

import torch

from ..results import WatchResults

__all__ = [
    "first_index",
    "index_of_step",
    "layer_order",
    "module_of",
    "previous_layer",
    "step_at",
    "table",
    "windowed_median",
]


def layer_order(results: WatchResults) -> list[str]:
    """Module paths in forward order: `results.execution_order` when recorded, else (and then) model order.

    Paths only the series know come last, as they come.
    """
    order: list[str] = []
    seen: set[str] = set()
    for group in (
        results.execution_order,
        results.layers,
        results.activations,
        results.output_grads,
        results.unit_activity,
        results.identical_units,
    ):
        for path in group:
            if path not in seen:
                seen.add(path)
                order.append(path)
    return order


def previous_layer(results: WatchResults, path: str) -> str | None:
    """The path just before `path` in forward order (the layer that most likely feeds it), or `None`."""
    order = layer_order(results)
    index = order.index(path) if path in order else 0
    return order[index - 1] if index > 0 else None


def module_of(parameter: str) -> str:
    """The module path of a parameter name (`"net.0.weight"` -> `"net.0"`)."""
    return parameter.rpartition(".")[0]


def step_at(results: WatchResults, index: int) -> int:
    """The step number recorded at position `index` (the index itself when `steps` is shorter)."""
    return int(results.steps[index]) if 0 <= index < results.steps.numel() else index


def index_of_step(results: WatchResults, step: int) -> int | None:
    """The position of step number `step` in `results.steps`, or `None`."""
    hits = (results.steps == step).nonzero()
    return int(hits[0, 0]) if hits.numel() else None


def table(series: list[torch.Tensor], finite_only: bool = True) -> torch.Tensor:
    """Stack (S,) series into one (N, S) float64 table; non-finite values become NaN when `finite_only`.

    Shape:
        (N, S): one row per series, padded with NaN to the longest.
    """
    length = max((s.numel() for s in series), default=0)
    out = torch.full((len(series), length), float("nan"), dtype=torch.float64)
    for row, values in enumerate(series):
        out[row, : values.numel()] = values.detach().to(torch.float64).reshape(-1)
    if finite_only:
        out[~torch.isfinite(out)] = float("nan")
    return out


def windowed_median(values: torch.Tensor, window: int) -> torch.Tensor:
    """NaN-ignoring median over each run of `window` consecutive recorded steps (all of them when fewer).

    Shape:
        values: (..., S) -> (..., max(S - window + 1, 1)); position t covers steps t .. t + window - 1.
    """
    width = max(min(window, values.shape[-1]), 1)
    if values.shape[-1] == 0:
        return values
    return values.unfold(-1, width, 1).nanmedian(-1).values


def first_index(mask: torch.Tensor) -> int | None:
    """The first position where the (S,) bool `mask` is true, or `None`."""
    hits = mask.nonzero()
    return int(hits[0, 0]) if hits.numel() else None
