"""Helpers shared by the checks: forward order of layers, step lookup, NaN-aware windowed medians, gradient tables,
the learning-rate warmup."""

from __future__ import annotations

import itertools

import torch

from ..results._results import WatchResults

__all__ = [
    "first_index",
    "index_of_step",
    "layer_order",
    "module_of",
    "previous_layer",
    "step_at",
    "table",
    "warmup_length",
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


def warmup_length(results: WatchResults) -> int | None:
    """How many recorded steps from the first are the learning-rate warmup, or `None` when the learning rate is
    unknown (no optimizer watched, or results saved before it was recorded).

    The learning rate of a step is the median over the weight tensors of `results.optimizer[name]["lr"]`. The
    warmup is the run of recorded steps from the first over which it rises (each step's above the one before, by
    more than a relative 1e-6; steps without a known learning rate are passed over), up to the step where it
    stops rising, that last rising step included: a linear warmup then cosine gives its warmup steps, a constant
    learning rate or a run resumed after its warmup gives 0, and a learning rate raised later in the run (a
    restart) does not count.
    """
    names = [n for n, s in results.optimizer.items() if "lr" in s and n.rpartition(".")[2] != "bias"]
    if not names:
        return None
    rates = table([results.optimizer[n]["lr"] for n in names]).nanmedian(0).values
    known = torch.isfinite(rates).nonzero()[:, 0].tolist()
    if not known:
        return None
    length = 0
    for before, after in itertools.pairwise(known):
        if not float(rates[after]) > float(rates[before]) * (1 + 1e-6):
            break
        length = after + 1
    return length
