"""Turn recorded tables into `WatchResults`: the last step of a value's path.

Before: `_store.py` keeps the measured steps (`SeriesStore.table()`, a `Chunk` of `_buffers.py`). After: the
results schema, `hookscope.results`.
"""

from __future__ import annotations

import torch

from ..results._results import (
    ACTIVATION_STATS,
    ATTENTION_STATS,
    GRAD_STATS,
    OPTIMIZER_STATS,
    RESIDUAL_STATS,
    WatchResults,
)
from ..stats._histogram import auto_edges, fixed_edges, on_widest_range
from ._buffers import Chunk
from ._options import WatchOptions

__all__ = ["build_results"]

_COUNT = ACTIVATION_STATS.index("count")


def build_results(
    table: Chunk | None,
    paths: list[str],
    kinds: list[str],
    param_names: list[str],
    options: WatchOptions,
    blocks: list[str] | None = None,
) -> WatchResults:
    """Build the per-layer series of `WatchResults` from `table` (empty series when `table` is `None`); `blocks`
    are the paths of the repeated blocks (the residual stream's columns).

    Each layer's histograms are brought to one range: the widest of its rows (re-binned exactly), or the fixed
    `hist_range`, whose edges go into `hist_edges`.
    """
    if table is None:
        table = _empty(len(paths), len(param_names), options.hist_bins, len(blocks or []))
    groups = options.groups
    results = WatchResults(steps=table.steps.clone(), layers=dict(zip(paths, kinds, strict=True)))
    if "activations" in groups:
        results.activations = {p: _columns(table.activations[:, j], ACTIVATION_STATS) for j, p in enumerate(paths)}
    if "histograms" in groups:
        _histograms(results, table, paths, options)
    if "output_grads" in groups:
        results.output_grads = {p: _columns(table.output_grads[:, j], GRAD_STATS) for j, p in enumerate(paths)}
    if "param_grads" in groups:
        results.param_grads = {n: _columns(table.param_grads[:, i], GRAD_STATS) for i, n in enumerate(param_names)}
    if "update_ratios" in groups:
        results.update_ratios = {n: table.update_ratios[:, i].clone() for i, n in enumerate(param_names)}
    if "attention" in groups:
        results.attention = {
            path: {stat: values[..., k].clone() for k, stat in enumerate(ATTENTION_STATS)}
            for path, values in table.attention.items()
        }
    if "residual" in groups:
        results.residual = {p: _columns(table.residual[:, j], RESIDUAL_STATS) for j, p in enumerate(blocks or [])}
    if "optimizer" in groups and bool(table.optimizer[..., 1:].isfinite().any()):  # an optimizer was seen
        results.optimizer = {n: _columns(table.optimizer[:, i], OPTIMIZER_STATS) for i, n in enumerate(param_names)}
    if table.has_loss:
        results.losses = table.losses.clone()
        results.loss_counts = table.loss_counts.clone()
    return results


def _histograms(results: WatchResults, table: Chunk, paths: list[str], options: WatchOptions) -> None:
    """Fill the histograms of every layer that was observed, on one range per layer."""
    bins, seen = options.hist_bins, table.activations[..., _COUNT].nan_to_num(0.0) > 0  # (S, modules)
    for j, path in enumerate(paths):
        if not bool(seen[:, j].any()):
            continue
        counts = table.histograms[:, j]
        if options.hist_range is not None:
            results.hist_edges[path] = fixed_edges(options.hist_range, bins)
            results.hist_outside[path] = counts[:, bins:].clone()
        else:
            counts, target = on_widest_range(counts, table.exponents[:, j])
            results.hist_edges[path] = auto_edges(int(target), bins)
        results.histograms[path] = counts[:, :bins].clone()


def _columns(values: torch.Tensor, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {name: values[:, k].clone() for k, name in enumerate(names)}


def _empty(modules: int, params: int, bins: int, blocks: int) -> Chunk:
    return Chunk(
        steps=torch.zeros(0, dtype=torch.int64),
        activations=torch.zeros(0, modules, len(ACTIVATION_STATS), dtype=torch.float64),
        histograms=torch.zeros(0, modules, bins + 2, dtype=torch.float64),
        exponents=torch.zeros(0, modules, dtype=torch.int64),
        output_grads=torch.zeros(0, modules, len(GRAD_STATS), dtype=torch.float64),
        param_grads=torch.zeros(0, params, len(GRAD_STATS), dtype=torch.float64),
        update_ratios=torch.zeros(0, params, dtype=torch.float64),
        losses=torch.zeros(0, dtype=torch.float64),
        loss_counts=torch.zeros(0, dtype=torch.float64),
        residual=torch.zeros(0, blocks, len(RESIDUAL_STATS), dtype=torch.float64),
        optimizer=torch.zeros(0, params, len(OPTIMIZER_STATS), dtype=torch.float64),
    )
