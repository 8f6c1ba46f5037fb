"""Merge the `WatchResults` of several ranks into one: exact where the statistics allow it, labelled where not.

How each part combines, step by step (steps are unioned; a rank that did not record a step adds nothing to it):
activations as the engine's records (`hookscope.stats`: Chan's formulas, min/max, counts summed), so a 2-rank run on
two halves of a batch gives what one process gives on the whole batch. Output-gradient norms combine as the root of
summed squares (the ranks hold different samples), divided by the world size by default: DDP and FSDP average
gradients, so this is the gradient of the loss they optimize, the mean of the ranks' losses. Parameter gradients and
update ratios after DDP's all-reduce are the same on every rank and are taken once (checked: steps where ranks
differ become NaN, counted in `dropped` and listed in `meta["distributed"]`); FSDP2 shard norms combine as the root
of summed squares. Histograms are re-binned exactly to the widest range of any rank and summed (a fixed `hist_range`
must be the same on every rank). Losses, those of every logged step (`logged_steps`) too, are averaged over the
ranks that logged one. Attention: the max logit is the largest of any rank, entropy, sink and the sampled fraction
are averaged over the ranks that measured (equal batches); the residual stream's largest magnitude is the largest of
any rank (with that rank's channel and token), its median the mean of the ranks'; the optimizer series are the mean
of the ranks' (equal on replicas after DDP's all-reduce; shard-local under FSDP2). The sequence is
`hookscope.distributed.merge_parts`'s, shared with every merge.
"""

from __future__ import annotations

import datetime
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._check import NON_EMPTY, TIMEOUT, checked
from ..distributed import DEFAULT_TIMEOUT, GRAD_SHARDED, MergeWarning, combine_parts, combine_ranks, merge_parts
from ..stats._histogram import EXPONENT_NONE, auto_edges, exponent_of_edges, fixed_edges, rebin, widest_exponent
from ..stats._norms import root_sum_squares
from ..stats._record import finalize, from_statistics
from ._nonfinite import merge_first
from ._results import ACTIVATION_STATS, ATTENTION_STATS, GRAD_STATS, OPTIMIZER_STATS, RESIDUAL_STATS, WatchResults

__all__ = ["combine_results", "merge_results"]

_NAN = math.nan
_OPS = {
    "activations": "gather",
    "output_grads": "gather",
    "param_grads": "gather",
    "update_ratios": "gather",
    "losses": "gather",
    "loss_counts": "gather",
    "logged_losses": "gather",
    "logged_seen": "gather",
    "attention": "gather",
    "residual": "gather",
    "optimizer": "gather",
    "hists": "sum",
    "outside": "sum",
    "units": "sum",
    "unit_weights": "sum",
}


@checked(timeout=TIMEOUT)
def merge_results(
    results: WatchResults, *, average_output_grads: bool = True, timeout: datetime.timedelta = DEFAULT_TIMEOUT
) -> WatchResults:
    """Merge every rank's `results` into one; a collective: every rank calls it and gets the merged results.

    Every rank joins the same collectives (layer names and steps are unioned first), also a rank that recorded
    nothing or other layers; each has `timeout`. Outside a distributed run: `combine_results([results])`. Write
    files from rank 0 only (`hookscope.distributed.is_main_process()`).

    Args:
        results: This rank's results (`watch(...).results()`).
        average_output_grads: Divide merged output-gradient norms by the world size (see the module docstring).
        timeout: The most each collective waits for the other ranks.

    Raises:
        TypeError: `results` is not `WatchResults`.
        ValueError: the ranks used different fixed histogram ranges.
    """
    if not isinstance(results, WatchResults):
        raise TypeError(f"results must be WatchResults (watch(...).results()), got {type(results).__name__}")
    return _merge(results, None, average_output_grads, timeout)


@checked(parts=NON_EMPTY)
def combine_results(parts: Sequence[WatchResults], *, average_output_grads: bool = True) -> WatchResults:
    """Merge the results of several ranks given together (e.g. per-rank files loaded with `WatchResults.load`).

    Same rules as `merge_results`, in the order given (rank 0 first); no collective.

    Raises:
        ValueError: `parts` is empty, or the parts used different fixed histogram ranges.
        TypeError: an element of `parts` is not `WatchResults`.
    """
    parts = list(parts)
    if not parts:
        raise ValueError("parts must hold at least one WatchResults, got an empty sequence")
    for part in parts:
        if not isinstance(part, WatchResults):
            raise TypeError(f"parts must hold WatchResults only, got {type(part).__name__}")
    return _merge(None, parts, average_output_grads, DEFAULT_TIMEOUT)


def _merge(
    own: WatchResults | None, parts: list[WatchResults] | None, average: bool, timeout: datetime.timedelta
) -> WatchResults:
    steps: dict[str, Any] = {"header": _header, "layout": _Layout.build, "pack": _pack, "ops": _OPS}
    steps["assemble"] = lambda headers, layout, tables: _assemble(headers, layout, tables, average)
    if own is not None:
        merged, notes = merge_parts(own, timeout=timeout, **steps)
    else:
        merged, notes = combine_parts(parts or [], **steps)
    for note in notes:
        warnings.warn(note, MergeWarning, stacklevel=4)
    return merged  # type: ignore[no-any-return]


# ---- what each rank has, and the union of it --------------------------------------------------------------------


def _header(results: WatchResults) -> dict[str, Any]:
    """The small, picklable description of one rank's results that every rank needs to align the tensors."""
    fixed = results.meta.get("hist_range")
    hists = {p: (EXPONENT_NONE if fixed else exponent_of_edges(results.hist_edges[p])) for p in results.histograms}
    return {
        "steps": results.steps.tolist(),
        "layers": dict(results.layers),
        "activations": list(results.activations),
        "output_grads": list(results.output_grads),
        "param_grads": list(results.param_grads),
        "update_ratios": list(results.update_ratios),
        "attention": {path: int(stats["max_logit"].shape[-1]) for path, stats in results.attention.items()},
        "residual": list(results.residual),
        "optimizer": list(results.optimizer),
        "losses": results.losses is not None,
        "logged": [] if results.logged_steps is None else results.logged_steps.tolist(),
        "hist_range": None if fixed is None else list(fixed),
        "hists": hists,
        "bins": next((h.shape[-1] for h in results.histograms.values()), 0),
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
    """The union of every rank's steps and names, the widest histogram ranges, the shapes of the packed tables."""

    steps: list[int]
    activations: list[str]
    output_grads: list[str]
    param_grads: list[str]
    update_ratios: list[str]
    attention: dict[str, int]  # path -> heads
    residual: list[str]
    optimizer: list[str]
    has_losses: bool
    logged: list[int]  # the union of the steps whose loss a rank logged
    hist_range: list[float] | None
    bins: int
    hists: dict[str, int] = field(default_factory=dict)  # path -> the widest exponent of any rank
    units: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(cls, headers: list[dict[str, Any]]) -> _Layout:
        ranges = [h["hist_range"] for h in headers if h["hists"]]
        if any(r != ranges[0] for r in ranges):
            raise ValueError(
                f"hist_range must be the same on every rank, got {ranges} (rank order); watch every rank with the "
                "same hist_range, or None (a range that follows the data, merged exactly)"
            )
        paths = _union([list(h["hists"]) for h in headers])
        hists = {p: widest_exponent(h["hists"][p] for h in headers if p in h["hists"]) for p in paths}
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
            attention={path: heads for h in headers for path, heads in h["attention"].items()},
            residual=_union([h["residual"] for h in headers]),
            optimizer=_union([h["optimizer"] for h in headers]),
            has_losses=any(h["losses"] for h in headers),
            logged=sorted({step for header in headers for step in header.get("logged", ())}),
            hist_range=ranges[0] if ranges else None,
            bins=max(h["bins"] for h in headers),
            hists=hists,
            units=units,
        )


# ---- packing one rank's results into aligned tensors ------------------------------------------------------------


def _rows(results: WatchResults, layout: _Layout) -> torch.Tensor:
    index = {step: row for row, step in enumerate(layout.steps)}
    return torch.tensor([index[step] for step in results.steps.tolist()], dtype=torch.int64)


def _fill(
    names: list[str], source: dict[str, dict[str, torch.Tensor]], stats: Sequence[str], rows: Any, steps: int
) -> torch.Tensor:
    table = torch.full((steps, len(names), len(stats)), _NAN, dtype=torch.float64)
    for j, name in enumerate(names):
        series = source.get(name, {})
        for k, stat in enumerate(stats):
            if stat in series:
                table[rows, j, k] = series[stat].double()
    return table


def _pack_logged(results: WatchResults, layout: _Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's logged losses on the union of logged steps, and where it logged one (1.0) or not (0.0)."""
    losses = torch.full((len(layout.logged),), _NAN, dtype=torch.float64)
    seen = torch.zeros(len(layout.logged), dtype=torch.float64)
    if results.logged_steps is not None and results.logged_losses is not None and layout.logged:
        index = {step: k for k, step in enumerate(layout.logged)}
        at = torch.tensor([index[step] for step in results.logged_steps.tolist()], dtype=torch.int64)
        losses[at], seen[at] = results.logged_losses.double(), 1.0
    return losses, seen


def _pack(results: WatchResults, header: dict[str, Any], layout: _Layout) -> dict[str, torch.Tensor]:
    """All per-step series of `results` in `layout`'s order, NaN (or empty records) where absent."""
    rows, steps = _rows(results, layout), len(layout.steps)
    statistics = _fill(layout.activations, results.activations, ACTIVATION_STATS, rows, steps)
    ratios = {name: {"ratio": series} for name, series in results.update_ratios.items()}
    losses = torch.full((steps,), _NAN, dtype=torch.float64)
    logged = torch.zeros(steps, dtype=torch.float64)
    if results.losses is not None:
        losses[rows] = results.losses.double()
        logged[rows] = results.loss_logged().double()
    hists = torch.zeros(steps, len(layout.hists), layout.bins, dtype=torch.float64)
    outside = torch.zeros(steps, len(layout.hists), 2, dtype=torch.float64)
    for j, (path, target) in enumerate(layout.hists.items()):
        counts = results.histograms.get(path)
        if counts is None:
            continue
        if layout.hist_range is None:
            padded = torch.nn.functional.pad(counts.double(), (0, 2))
            own = torch.full((padded.shape[0],), header["hists"][path], dtype=torch.int64)
            counts = rebin(padded, own, torch.full_like(own, target))[:, : layout.bins]
        hists[rows, j] = counts.double()
        if path in results.hist_outside:
            outside[rows, j] = results.hist_outside[path].double()
    units, weights = _pack_units(results, layout)
    logged_losses, logged_seen = _pack_logged(results, layout)
    return {
        "activations": from_statistics(statistics),
        "output_grads": _fill(layout.output_grads, results.output_grads, GRAD_STATS, rows, steps),
        "param_grads": _fill(layout.param_grads, results.param_grads, GRAD_STATS, rows, steps),
        "update_ratios": _fill(layout.update_ratios, ratios, ("ratio",), rows, steps),
        "losses": losses,
        "loss_counts": logged,
        "logged_losses": logged_losses,
        "logged_seen": logged_seen,
        "attention": _pack_attention(results, layout, rows, steps),
        "residual": _fill(layout.residual, results.residual, RESIDUAL_STATS, rows, steps),
        "optimizer": _fill(layout.optimizer, results.optimizer, OPTIMIZER_STATS, rows, steps),
        "hists": hists,
        "outside": outside,
        "units": units,
        "unit_weights": weights,
    }


def _pack_attention(results: WatchResults, layout: _Layout, rows: Any, steps: int) -> torch.Tensor:
    """(steps, heads of every attention module, len(ATTENTION_STATS)), NaN where the rank did not measure."""
    table = torch.full((steps, sum(layout.attention.values()), len(ATTENTION_STATS)), _NAN, dtype=torch.float64)
    start = 0
    for path, heads in layout.attention.items():
        stats = results.attention.get(path, {})
        for k, stat in enumerate(ATTENTION_STATS):
            if stat in stats and stats[stat].shape[-1] == heads:
                table[rows, start : start + heads, k] = stats[stat].double()
        start += heads
    return table


def _merge_attention(block: torch.Tensor, layout: _Layout) -> dict[str, dict[str, torch.Tensor]]:
    """(ranks, S, heads, stats) -> per path and stat (S, heads): the largest max logit, the mean of the rest."""
    largest = block[..., 0].nan_to_num(float("-inf")).amax(0)
    merged = torch.cat((torch.where(torch.isinf(largest), _NAN, largest)[..., None], block[..., 1:].nanmean(0)), -1)
    out, start = {}, 0
    for path, heads in layout.attention.items():
        out[path] = {stat: merged[:, start : start + heads, k].clone() for k, stat in enumerate(ATTENTION_STATS)}
        start += heads
    return out


def _merge_residual(block: torch.Tensor) -> torch.Tensor:
    """(ranks, S, blocks, 4) -> (S, blocks, 4): the largest magnitude with its rank's channel and token, the mean
    median."""
    rank = block[..., 0].nan_to_num(float("-inf")).argmax(0, keepdim=True)  # (1, S, blocks)
    largest = block.gather(0, rank[..., None].expand(1, *block.shape[1:]))[0]
    return torch.cat((largest[..., :3], block[..., 3:].nanmean(0)), -1)


def _pack_units(results: WatchResults, layout: _Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """Each unit's active fraction times the values the rank observed (and those weights), to average over ranks."""
    units = torch.zeros(sum(layout.units.values()), dtype=torch.float64)
    weights = torch.zeros(len(layout.units), dtype=torch.float64)
    start = 0
    for j, (path, size) in enumerate(layout.units.items()):
        found = results.unit_activity.get(path)
        if found is not None and found.numel() == size:
            count = results.activations.get(path, {}).get("count")  # values seen: what the fractions average over
            weight = 1.0 if count is None else float(count.double().nan_to_num(0.0).sum())
            units[start : start + size] = found.double().reshape(-1) * weight
            weights[j] = weight
        start += size
    return units, weights


# ---- merging the aligned tensors --------------------------------------------------------------------------------


def _series(table: torch.Tensor, names: list[str], stats: Sequence[str]) -> dict[str, dict[str, torch.Tensor]]:
    return {name: {stat: table[:, j, k].double() for k, stat in enumerate(stats)} for j, name in enumerate(names)}


def _mean_of_logged(losses: torch.Tensor, logged: torch.Tensor) -> torch.Tensor:
    """(ranks, L) losses -> (L,): the mean over the ranks that logged one (a non-finite one stays so); NaN where no
    rank logged one (0/0)."""
    return torch.where(logged, losses, 0.0).sum(0).div(logged.sum(0))


def _root_sum_squares(block: torch.Tensor, divide: float = 1.0) -> torch.Tensor:
    """(ranks, S, N, 2) norms and non-finite counts -> (S, N, 2): root of summed squares, summed counts."""
    seen = ~block[..., 1].isnan()
    norm = torch.where(seen, block[..., 0], 0.0)
    root = root_sum_squares(norm, dim=0) / divide
    nonfinite = torch.where(seen, block[..., 1], 0.0).sum(0)
    return torch.where(seen.any(0)[..., None], torch.stack((root, nonfinite), dim=-1), _NAN)


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


def _assemble(
    headers: list[dict[str, Any]], layout: _Layout, tables: dict[str, torch.Tensor], average_output_grads: bool
) -> tuple[WatchResults, list[str]]:
    """Build the merged results from the reduced tables; also return the warnings to give."""
    world, notes = len(headers), list[str]()
    merged = WatchResults(steps=torch.tensor(layout.steps, dtype=torch.int64))
    merged.activations = _series(finalize(combine_ranks(tables["activations"])), layout.activations, ACTIVATION_STATS)
    divide = float(world) if average_output_grads else 1.0
    merged.output_grads = _series(_root_sum_squares(tables["output_grads"], divide), layout.output_grads, GRAD_STATS)
    report = _merge_params(merged, headers, layout, tables, notes)
    merged.attention = _merge_attention(tables["attention"], layout)
    merged.residual = _series(_merge_residual(tables["residual"]), layout.residual, RESIDUAL_STATS)
    merged.optimizer = _series(tables["optimizer"].nanmean(0), layout.optimizer, OPTIMIZER_STATS)
    if layout.has_losses:
        logged = tables["loss_counts"] > 0
        merged.losses = _mean_of_logged(tables["losses"], logged)
        merged.loss_counts = logged.sum(0).double()
    if layout.logged:
        merged.logged_steps = torch.tensor(layout.logged, dtype=torch.int64)
        merged.logged_losses = _mean_of_logged(tables["logged_losses"], tables["logged_seen"] > 0)
    for j, (path, exponent) in enumerate(layout.hists.items()):
        merged.histograms[path] = tables["hists"][:, j].clone()
        if layout.hist_range is None:
            merged.hist_edges[path] = auto_edges(exponent, layout.bins)
        else:
            low, high = layout.hist_range
            merged.hist_edges[path] = fixed_edges((low, high), layout.bins)
            merged.hist_outside[path] = tables["outside"][:, j].clone()
    merged.unit_activity = _units(tables, layout)
    _merge_rest(merged, headers)
    scaled = ", divided by the world size (gradient of the mean of the ranks' losses)" if average_output_grads else ""
    merged.meta["distributed"] = {
        "world_size": world,
        "activations": "merged over ranks by Chan's formulas (count-weighted)",
        "output_grads": "root sum of squares over ranks" + scaled,
        **report,
        "histograms": "re-binned exactly to the widest range of any rank and summed",
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
    merged.update_ratios = {name: ratios[:, j, 0].double() for j, name in enumerate(layout.update_ratios)}
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


def _units(tables: dict[str, torch.Tensor], layout: _Layout) -> dict[str, torch.Tensor]:
    """Unit activity: each rank's fractions weighted by the number of values it observed."""
    values, weights, out, start = tables["units"], tables["unit_weights"], {}, 0
    for j, (path, size) in enumerate(layout.units.items()):
        if float(weights[j]) > 0:
            out[path] = values[start : start + size] / weights[j]
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
