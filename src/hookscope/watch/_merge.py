"""Merge the `WatchResults` of several ranks into one: exact where the statistics allow it, labelled where not.

How each part combines, step by step (steps are unioned; a rank that did not record a step adds nothing to it):
activations by Chan's formulas on (count, mean, m2), so a 2-rank run on two halves of a batch gives what one
process gives on the whole batch; min/max by min/max, fractions (`near_zero`, `saturated`) weighted by counts,
non-finite counts and value counts summed. Output-gradient norms combine as the root of summed squares (the
ranks hold different samples), divided by the world size by default: DDP and FSDP average gradients, so this is
the gradient of the loss they optimize, the mean of the ranks' losses. Parameter gradients and update ratios
after DDP's all-reduce are the same on every rank and are taken once (checked: steps where ranks differ become
NaN, counted in `dropped` and listed in `meta["distributed"]`); FSDP2 shard norms combine as the root of summed
squares. Histograms add their counts when every rank has the same edges, and are re-binned onto a common range
otherwise (a `MergeWarning`; pass `hist_range=` to `watch()` for exact merges). Losses are averaged over ranks.
"""

from __future__ import annotations

import datetime
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._check import NON_EMPTY, TIMEOUT, checked
from ..distributed import (
    DEFAULT_TIMEOUT,
    GRAD_SHARDED,
    MergeWarning,
    all_gather,
    all_reduce,
    chan_merge,
    common_edges,
    gather_objects,
    rebin,
)
from ._assemble import merge_first
from ._results import ACTIVATION_STATS, GRAD_STATS, WatchResults

__all__ = ["combine_results", "merge_results"]

_COLUMN = {name: k for k, name in enumerate(ACTIVATION_STATS)}
_NAN = math.nan


@checked(timeout=TIMEOUT)
def merge_results(
    results: WatchResults, *, average_output_grads: bool = True, timeout: datetime.timedelta = DEFAULT_TIMEOUT
) -> WatchResults:
    """Merge every rank's `results` into one; a collective: every rank calls it and gets the merged results.

    Every rank joins the same three collectives (layer names and steps are unioned first), also a rank that
    recorded nothing or other layers; each has `timeout`. Outside a distributed run: `combine_results([results])`.
    Write files from rank 0 only (`hookscope.distributed.is_main_process()`).

    Args:
        results: This rank's results (`watch(...).results()`).
        average_output_grads: Divide merged output-gradient norms by the world size (see the module docstring).
        timeout: The most each collective waits for the other ranks.

    Raises:
        TypeError: `results` is not `WatchResults`.
    """
    if not isinstance(results, WatchResults):
        raise TypeError(f"results must be WatchResults (watch(...).results()), got {type(results).__name__}")
    headers = gather_objects(_header(results), timeout=timeout)
    layout = _Layout.build(headers)
    scalars = torch.stack(all_gather(_pack_scalars(results, layout), timeout=timeout))
    hists = all_reduce(_pack_hists(results, layout), "sum", timeout=timeout)
    merged, notes = _assemble(headers, layout, scalars, hists, average_output_grads)
    _warn(notes)
    return merged


@checked(parts=NON_EMPTY)
def combine_results(parts: Sequence[WatchResults], *, average_output_grads: bool = True) -> WatchResults:
    """Merge the results of several ranks given together (e.g. per-rank files loaded with `WatchResults.load`).

    Same rules as `merge_results`, in the order given (rank 0 first); no collective.

    Raises:
        ValueError: `parts` is empty.
        TypeError: an element of `parts` is not `WatchResults`.
    """
    parts = list(parts)
    if not parts:
        raise ValueError("parts must hold at least one WatchResults, got an empty sequence")
    for part in parts:
        if not isinstance(part, WatchResults):
            raise TypeError(f"parts must hold WatchResults only, got {type(part).__name__}")
    headers = [_header(part) for part in parts]
    layout = _Layout.build(headers)
    scalars = torch.stack([_pack_scalars(part, layout) for part in parts])
    hists = torch.stack([_pack_hists(part, layout) for part in parts]).sum(0)
    merged, notes = _assemble(headers, layout, scalars, hists, average_output_grads)
    _warn(notes)
    return merged


def _warn(notes: list[str]) -> None:
    for note in notes:
        warnings.warn(note, MergeWarning, stacklevel=3)


# ---- what each rank has, and the union of it --------------------------------------------------------------------


def _header(results: WatchResults) -> dict[str, Any]:
    """The small, picklable description of one rank's results that every rank needs to align the tensors."""
    return {
        "steps": results.steps.tolist(),
        "layers": dict(results.layers),
        "activations": list(results.activations),
        "output_grads": list(results.output_grads),
        "param_grads": list(results.param_grads),
        "update_ratios": list(results.update_ratios),
        "losses": results.losses is not None,
        "hist_edges": {p: results.hist_edges[p].tolist() for p in results.histograms if p in results.hist_edges},
        "units": {path: t.numel() for path, t in results.unit_activity.items()},
        "identical_units": dict(results.identical_units),
        "first_nonfinite": results.first_nonfinite,
        "unobserved": dict(results.unobserved),
        "execution_order": list(results.execution_order),
        "dropped": dict(results.dropped),
        "skipped_steps": list(results.skipped_steps),
        "meta": dict(results.meta),
    }


def _union(lists: Sequence[Sequence[str]]) -> list[str]:
    return list(dict.fromkeys(name for names in lists for name in names))


@dataclass
class _Layout:
    """The union of every rank's steps and names, and the shapes of the packed tables (the same on all ranks)."""

    steps: list[int]
    activations: list[str]
    output_grads: list[str]
    param_grads: list[str]
    update_ratios: list[str]
    has_losses: bool
    hist: dict[str, tuple[torch.Tensor, bool]]  # path -> (target edges, same edges on every rank)
    units: dict[str, int]

    @classmethod
    def build(cls, headers: list[dict[str, Any]]) -> _Layout:
        edges: dict[str, list[torch.Tensor]] = {}
        for header in headers:
            for path, values in header["hist_edges"].items():
                edges.setdefault(path, []).append(torch.tensor(values, dtype=torch.float64))
        units: dict[str, int] = {}
        for header in headers:
            for path, size in header["units"].items():
                units.setdefault(path, size)
        return cls(
            steps=sorted({step for header in headers for step in header["steps"]}),
            activations=_union([h["activations"] for h in headers]),
            output_grads=_union([h["output_grads"] for h in headers]),
            param_grads=_union([h["param_grads"] for h in headers]),
            update_ratios=_union([h["update_ratios"] for h in headers]),
            has_losses=any(h["losses"] for h in headers),
            hist={path: common_edges(found) for path, found in edges.items()},
            units=units,
        )

    def shapes(self) -> dict[str, tuple[int, ...]]:
        steps = len(self.steps)
        return {
            "activations": (steps, len(self.activations), len(ACTIVATION_STATS)),
            "output_grads": (steps, len(self.output_grads), len(GRAD_STATS)),
            "param_grads": (steps, len(self.param_grads), len(GRAD_STATS)),
            "update_ratios": (steps, len(self.update_ratios), 1),
            "losses": (steps,),
            "units": (sum(self.units.values()),),
            "unit_weights": (len(self.units),),
        }


# ---- packing one rank's results into aligned tensors ------------------------------------------------------------


def _rows(results: WatchResults, layout: _Layout) -> torch.Tensor:
    index = {step: row for row, step in enumerate(layout.steps)}
    return torch.tensor([index[step] for step in results.steps.tolist()], dtype=torch.int64)


def _fill(
    shape: tuple[int, ...],
    names: list[str],
    source: dict[str, dict[str, torch.Tensor]],
    stats: Sequence[str],
    rows: Any,
) -> torch.Tensor:
    table = torch.full(shape, _NAN, dtype=torch.float64)
    for j, name in enumerate(names):
        series = source.get(name, {})
        for k, stat in enumerate(stats):
            if stat in series:
                table[rows, j, k] = series[stat].double()
    return table


def _pack_scalars(results: WatchResults, layout: _Layout) -> torch.Tensor:
    """All per-step series of `results` (and unit activity) in `layout`'s order, NaN where absent, flat float64."""
    shapes, rows = layout.shapes(), _rows(results, layout)
    ratios = {name: {"ratio": series} for name, series in results.update_ratios.items()}
    tables = [
        _fill(shapes["activations"], layout.activations, results.activations, ACTIVATION_STATS, rows),
        _fill(shapes["output_grads"], layout.output_grads, results.output_grads, GRAD_STATS, rows),
        _fill(shapes["param_grads"], layout.param_grads, results.param_grads, GRAD_STATS, rows),
        _fill(shapes["update_ratios"], layout.update_ratios, ratios, ("ratio",), rows),
    ]
    losses = torch.full(shapes["losses"], _NAN, dtype=torch.float64)
    if results.losses is not None:
        losses[rows] = results.losses.double()
    units = torch.full(shapes["units"], _NAN, dtype=torch.float64)
    weights = torch.zeros(shapes["unit_weights"], dtype=torch.float64)
    start = 0
    for j, (path, size) in enumerate(layout.units.items()):
        found = results.unit_activity.get(path)
        if found is not None and found.numel() == size:
            units[start : start + size] = found.double().reshape(-1)
            count = results.activations.get(path, {}).get("count")  # values seen: what the fractions average over
            weights[j] = 1.0 if count is None else float(count.double().nan_to_num(0.0).sum())
        start += size
    return torch.cat([t.reshape(-1) for t in (*tables, losses, units, weights)])


def _pack_hists(results: WatchResults, layout: _Layout) -> torch.Tensor:
    """Histogram counts of `results` on `layout`'s edges (re-binned where ranks differ), flat float64."""
    rows, parts = _rows(results, layout), []
    for path, (edges, exact) in layout.hist.items():
        block = torch.zeros(len(layout.steps), edges.numel() - 1, dtype=torch.float64)
        counts, own = results.histograms.get(path), results.hist_edges.get(path)
        if counts is not None and own is not None:
            block[rows] = counts.double() if exact else rebin(counts, own, edges)
        parts.append(block.reshape(-1))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def _unpack(stacked: torch.Tensor, layout: _Layout) -> dict[str, torch.Tensor]:
    out, start = {}, 0
    for name, shape in layout.shapes().items():
        size = math.prod(shape)
        out[name] = stacked[:, start : start + size].reshape(stacked.shape[0], *shape)
        start += size
    return out


# ---- merging the aligned tensors --------------------------------------------------------------------------------


def _merge_activations(block: torch.Tensor) -> torch.Tensor:
    """(ranks, S, layers, stats) -> (S, layers, stats): Chan's formulas, count-weighted fractions, min/max, sums."""
    count = block[..., _COLUMN["count"]].nan_to_num(0.0)
    seen = count > 0
    mean = torch.where(seen, block[..., _COLUMN["mean"]], 0.0)
    m2 = torch.where(count > 1, block[..., _COLUMN["std"]].square() * (count - 1), 0.0)
    merged = (count[0], mean[0], m2[0])
    for r in range(1, block.shape[0]):
        merged = chan_merge(merged, (count[r], mean[r], m2[r]))
    total, mean_all, m2_all = merged
    safe = total.clamp(min=1)
    std = torch.where(total > 1, (m2_all / (total - 1).clamp(min=1)).sqrt(), 0.0)
    column = {
        "mean": mean_all,
        "std": std,
        "rms": (m2_all / safe + mean_all.square()).sqrt(),
        "min": torch.where(seen, block[..., _COLUMN["min"]], math.inf).amin(0),
        "max": torch.where(seen, block[..., _COLUMN["max"]], -math.inf).amax(0),
        "nonfinite": torch.where(seen, block[..., _COLUMN["nonfinite"]], 0.0).sum(0),
        "count": total,
    }
    for name in ("near_zero", "saturated"):
        column[name] = torch.where(seen, block[..., _COLUMN[name]] * count, 0.0).sum(0) / safe
    stacked = torch.stack([column[name] for name in ACTIVATION_STATS], dim=-1)
    return torch.where((total > 0)[..., None], stacked, _NAN)


def _root_sum_squares(block: torch.Tensor, divide: float = 1.0) -> torch.Tensor:
    """(ranks, S, N, 2) norms and non-finite counts -> (S, N, 2): root of summed squares, summed counts."""
    seen = ~block[..., 1].isnan()
    norm = torch.where(seen, block[..., 0].square(), 0.0).sum(0).sqrt() / divide
    nonfinite = torch.where(seen, block[..., 1], 0.0).sum(0)
    return torch.where(seen.any(0)[..., None], torch.stack((norm, nonfinite), dim=-1), _NAN)


def _take_once(block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ranks, S, N, C) values that should be equal on every rank -> (S, N, C) and the (S, N) cells that differ.

    The first rank that has a value gives it; a cell where ranks disagree is NaN.
    """
    seen = ~block[..., -1].isnan()
    first_rank = seen.double().argmax(0)  # the first maximum: the lowest rank with a value
    index = first_rank[None, ..., None].expand(1, *block.shape[1:])
    first = block.gather(0, index)[0]
    same = torch.isclose(block, first[None], rtol=1e-5, atol=1e-12, equal_nan=True).all(-1) | ~seen
    differs = seen.any(0) & ~same.all(0)
    return torch.where(differs[..., None], _NAN, first), differs


def _series(table: torch.Tensor, names: list[str], stats: Sequence[str]) -> dict[str, dict[str, torch.Tensor]]:
    return {name: {stat: table[:, j, k].float() for k, stat in enumerate(stats)} for j, name in enumerate(names)}


def _assemble(
    headers: list[dict[str, Any]],
    layout: _Layout,
    scalars: torch.Tensor,
    hists: torch.Tensor,
    average_output_grads: bool,
) -> tuple[WatchResults, list[str]]:
    """Build the merged results from the stacked per-rank tables; also return the warnings to give."""
    world, tables = len(headers), _unpack(scalars, layout)
    notes: list[str] = []
    merged = WatchResults(steps=torch.tensor(layout.steps, dtype=torch.int64))
    merged.activations = _series(_merge_activations(tables["activations"]), layout.activations, ACTIVATION_STATS)
    divide = float(world) if average_output_grads else 1.0
    merged.output_grads = _series(_root_sum_squares(tables["output_grads"], divide), layout.output_grads, GRAD_STATS)
    report = _merge_params(merged, headers, layout, tables, notes)
    if layout.has_losses:
        losses = tables["losses"]
        merged.losses = losses.nansum(0).div((~losses.isnan()).sum(0)).float()  # 0/0 = NaN: no rank logged one
    merged.histograms, merged.hist_edges = _histograms(hists, layout, notes)
    merged.unit_activity = _units(tables, layout)
    _merge_rest(merged, headers)
    scaled = ", divided by the world size (gradient of the mean of the ranks' losses)" if average_output_grads else ""
    rebinned = [path for path, (_, exact) in layout.hist.items() if not exact]
    merged.meta["distributed"] = {
        "world_size": world,
        "activations": "merged over ranks by Chan's formulas (count-weighted)",
        "output_grads": "root sum of squares over ranks" + scaled,
        **report,
        "histograms": "counts summed" + (f"; re-binned (approximate): {rebinned}" if rebinned else ""),
        "recorded_steps_per_rank": [len(h["steps"]) for h in headers],
    }
    return merged, notes


def _is_sharded(headers: list[dict[str, Any]]) -> bool:
    return any(h["meta"].get("grad_reduction") == GRAD_SHARDED for h in headers)


def _merge_params(
    merged: WatchResults,
    headers: list[dict[str, Any]],
    layout: _Layout,
    tables: dict[str, torch.Tensor],
    notes: list[str],
) -> dict[str, Any]:
    """Fill parameter gradients and update ratios: shards by root sum of squares, replicas taken once."""
    if _is_sharded(headers):
        merged.param_grads = _series(_root_sum_squares(tables["param_grads"]), layout.param_grads, GRAD_STATS)
        if layout.update_ratios:
            merged.update_ratios = {n: torch.full((len(layout.steps),), _NAN) for n in layout.update_ratios}
            merged.dropped["update_ratios_sharded"] = len(layout.steps) * len(layout.update_ratios)
        return {
            "param_grads": "sharded (FSDP2): root sum of squares of the ranks' shard norms",
            "update_ratios": "not combined: ratios of shards do not give the ratio of the whole (NaN)",
        }
    grads, grads_differ = _take_once(tables["param_grads"])
    ratios, ratios_differ = _take_once(tables["update_ratios"])
    merged.param_grads = _series(grads, layout.param_grads, GRAD_STATS)
    merged.update_ratios = {name: ratios[:, j, 0].float() for j, name in enumerate(layout.update_ratios)}
    report: dict[str, Any] = {"param_grads": "the same on every rank (after all-reduce): taken once"}
    if not layout.param_grads:
        report["param_grads"] = "none recorded"
    for group, differs in (("param_grads", grads_differ), ("update_ratios", ratios_differ)):
        if bool(differs.any()):
            steps = sorted({layout.steps[s] for s in differs.any(1).nonzero().flatten().tolist()})
            merged.dropped[f"{group}_not_reduced"] = int(differs.sum())
            report[f"{group}_differ_at_steps"] = steps
            notes.append(
                f"{group} differ across ranks at {len(steps)} step(s) (first {steps[:5]}): local values, not reduced "
                "(read before DDP's all-reduce, or under no_sync()); they are NaN in the merged results. Give the "
                "optimizer to watch() to read gradients after the all-reduce"
            )
    if "param_grads_differ_at_steps" in report:
        report["param_grads"] = "local (not reduced) where ranks differ: NaN there; elsewhere taken once"
    return report


def _histograms(
    hists: torch.Tensor, layout: _Layout, notes: list[str]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    counts, edges_out, start = {}, {}, 0
    for path, (edges, _) in layout.hist.items():
        size = len(layout.steps) * (edges.numel() - 1)
        counts[path] = hists[start : start + size].reshape(len(layout.steps), -1).float()
        edges_out[path] = edges.float()
        start += size
    rebinned = [path for path, (_, exact) in layout.hist.items() if not exact]
    if rebinned:
        notes.append(
            f"histograms of {len(rebinned)} layer(s) have different bin edges on different ranks and were re-binned "
            f"onto a common range (approximate): {', '.join(map(repr, rebinned[:5]))}; pass watch(hist_range=(low, "
            "high)) for exact merges"
        )
    return counts, edges_out


def _units(tables: dict[str, torch.Tensor], layout: _Layout) -> dict[str, torch.Tensor]:
    """Unit activity: each rank's fractions weighted by the number of values it observed."""
    values, weights, out, start = tables["units"], tables["unit_weights"], {}, 0
    for j, (path, size) in enumerate(layout.units.items()):
        part, weight = values[:, start : start + size], weights[:, j : j + 1]
        present = ~part.isnan().any(1, keepdim=True) & (weight > 0)
        total = torch.where(present, weight, 0.0).sum(0)
        if float(total) > 0:
            out[path] = (torch.where(present, part * weight, 0.0).sum(0) / total).float()
        start += size
    return out


def _merge_rest(merged: WatchResults, headers: list[dict[str, Any]]) -> None:
    """Non-series parts: first non-finite (earliest step, lowest rank), unobserved on every rank, unions, sums."""
    for header in headers:
        for path, kind in header["layers"].items():
            merged.layers.setdefault(path, kind)
    merged.first_nonfinite = merge_first(*[h["first_nonfinite"] or {} for h in headers])
    if not _is_sharded(headers):  # replicas: the first rank's; shards cannot see duplicates across shards
        for header in headers:
            for path, count in header["identical_units"].items():
                merged.identical_units.setdefault(path, count)
    observed = {p for h in headers for p in h["layers"] if p not in h["unobserved"]}
    for header in headers:
        for path, reason in header["unobserved"].items():
            if path not in observed:
                merged.unobserved.setdefault(path, reason)
    merged.execution_order = _union([h["execution_order"] for h in headers])
    merged.skipped_steps = sorted({step for h in headers for step in h.get("skipped_steps", ())})
    for header in headers:
        for reason, count in header["dropped"].items():
            merged.dropped[reason] = merged.dropped.get(reason, 0) + count
    merged.meta = dict(headers[0]["meta"])
    merged.meta["recorded_steps"] = max((h["meta"].get("recorded_steps", 0) for h in headers), default=0)
