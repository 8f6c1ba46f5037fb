"""Merge `ActivationStats` records of several ranks: record k of every rank (its k-th observed batch) becomes
record k of the result, each module's moments merged by Chan's formulas, near-zero counts and histograms summed.

Modules are unioned over ranks (a rank that never saw a module adds nothing to it); ranks with fewer records add
nothing to the later ones. Histograms add their counts when every rank has the same edges (a fixed
`hist_range=`), and are re-binned onto a common range otherwise (a `MergeWarning`).
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
    MergeWarning,
    all_gather,
    all_reduce,
    chan_merge,
    common_edges,
    gather_objects,
    rebin,
)
from ._activation_stats import ActivationStats

__all__ = ["combine_activation_stats", "merge_activation_stats"]


@checked(timeout=TIMEOUT)
def merge_activation_stats(stats: ActivationStats, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> ActivationStats:
    """Merge every rank's `stats` into a new `ActivationStats` (not attached); a collective: every rank calls it.

    Every rank joins the same three collectives, also a rank with no records or other modules, each with
    `timeout`; every rank gets the same merged records. Outside a distributed run: `combine_activation_stats`.

    Raises:
        TypeError: `stats` is not `ActivationStats`.
        ValueError: the ranks' `near_zero`, `with_hist` or `hist_bins` differ (raised on every rank alike).
    """
    if not isinstance(stats, ActivationStats):
        raise TypeError(f"stats must be ActivationStats, got {type(stats).__name__}")
    state = stats.state_dict()
    own = _header(stats, state)
    headers = gather_objects(own, timeout=timeout)
    layout = _Layout.build(headers)
    moments = torch.stack(all_gather(_pack_moments(state, layout), timeout=timeout))
    hists = all_reduce(_pack_hists(state, own, layout), "sum", timeout=timeout)
    return _build(headers, layout, moments, hists)


@checked(parts=NON_EMPTY)
def combine_activation_stats(parts: Sequence[ActivationStats]) -> ActivationStats:
    """Merge the `ActivationStats` of several ranks given together (rank 0 first); no collective.

    Raises:
        ValueError: `parts` is empty, or their `near_zero`, `with_hist` or `hist_bins` differ.
        TypeError: an element of `parts` is not `ActivationStats`.
    """
    parts = list(parts)
    if not parts:
        raise ValueError("parts must hold at least one ActivationStats, got an empty sequence")
    for part in parts:
        if not isinstance(part, ActivationStats):
            raise TypeError(f"parts must hold ActivationStats only, got {type(part).__name__}")
    states = [part.state_dict() for part in parts]
    headers = [_header(part, state) for part, state in zip(parts, states, strict=True)]
    layout = _Layout.build(headers)
    moments = torch.stack([_pack_moments(state, layout) for state in states])
    hists = torch.stack([_pack_hists(s, h, layout) for s, h in zip(states, headers, strict=True)]).sum(0)
    return _build(headers, layout, moments, hists)


def _header(stats: ActivationStats, state: dict[str, Any]) -> dict[str, Any]:
    """What every rank needs to know of one rank's records: modules, record count, options, histogram edges."""
    edges = {}
    for path, scale_shift in zip(state["paths"], state["scales"], strict=True):
        if scale_shift is not None:
            scale, shift = (float(v) for v in scale_shift)
            edges[path] = ((torch.arange(stats.hist_bins + 1, dtype=torch.float64) - shift) / scale).tolist()
    return {
        "paths": list(state["paths"]),
        "records": int(state["tensors"]["counts"].shape[0]),
        "dropped": int(state["dropped"]),
        "options": {"near_zero": stats.near_zero, "with_hist": stats.with_hist, "hist_bins": stats.hist_bins},
        "hist_range": stats.hist_range,
        "every": stats.every,
        "capacity": stats.capacity,
        "edges": edges,
    }


@dataclass
class _Layout:
    """The union of modules and records over ranks, and each module's histogram edges (the same on all ranks)."""

    paths: list[str]
    records: int
    bins: int
    edges: dict[str, tuple[torch.Tensor, bool]]  # path -> (edges, the same on every rank)

    @classmethod
    def build(cls, headers: list[dict[str, Any]]) -> _Layout:
        for option in ("near_zero", "with_hist", "hist_bins"):
            values = [h["options"][option] for h in headers]
            if len(set(values)) > 1:
                raise ValueError(
                    f"{option} must be the same on every rank, got {values} (rank order); create ActivationStats "
                    "with the same arguments on every rank"
                )
        found: dict[str, list[torch.Tensor]] = {}
        for header in headers:
            for path, values in header["edges"].items():
                found.setdefault(path, []).append(torch.tensor(values, dtype=torch.float64))
        return cls(
            paths=list(dict.fromkeys(p for h in headers for p in h["paths"])),
            records=max(h["records"] for h in headers),
            bins=headers[0]["options"]["hist_bins"],
            edges={path: common_edges(edges) for path, edges in found.items()},
        )


def _pack_moments(state: dict[str, Any], layout: _Layout) -> torch.Tensor:
    """(records, modules, 4) float64 of count, mean, m2 and near-zero count, zero where not observed."""
    packed = torch.zeros(layout.records, len(layout.paths), 4, dtype=torch.float64)
    counts = state["tensors"]["counts"].double()
    moments = state["tensors"].get("moments")
    if moments is None or counts.numel() == 0:
        return packed
    rows = counts.shape[0]
    moments = moments[:rows].double()
    seen = counts > 0
    columns = [layout.paths.index(p) for p in state["paths"]]
    values = torch.stack((counts, moments[..., 0], moments[..., 1] * counts, moments[..., 2]), dim=-1)
    packed[:rows, columns] = torch.where(seen[..., None], values, 0.0)
    return packed


def _pack_hists(state: dict[str, Any], header: dict[str, Any], layout: _Layout) -> torch.Tensor:
    """(records, modules, bins) float64 histogram counts on the common edges (re-binned where ranks differ)."""
    packed = torch.zeros(layout.records, len(layout.paths), layout.bins, dtype=torch.float64)
    hists = state["tensors"].get("hists")
    if hists is None:
        return packed
    for j, path in enumerate(state["paths"]):
        if path in header["edges"]:
            target, exact = layout.edges[path]
            own = torch.tensor(header["edges"][path], dtype=torch.float64)
            counts = hists[:, j].double()
            column = layout.paths.index(path)
            packed[: counts.shape[0], column] = counts if exact else rebin(counts, own, target)
    return packed


def _build(
    headers: list[dict[str, Any]], layout: _Layout, moments: torch.Tensor, hists: torch.Tensor
) -> ActivationStats:
    """A new `ActivationStats` holding the merged records."""
    count, mean, m2 = moments[0, ..., 0], moments[0, ..., 1], moments[0, ..., 2]
    merged = (count, mean, m2)
    for r in range(1, moments.shape[0]):
        merged = chan_merge(merged, (moments[r, ..., 0], moments[r, ..., 1], moments[r, ..., 2]))
    count, mean, m2 = merged
    variance = m2 / count.clamp(min=1)
    first, options = headers[0], headers[0]["options"]
    result = ActivationStats(
        with_hist=options["with_hist"],
        every=first["every"],
        near_zero=options["near_zero"],
        hist_bins=layout.bins,
        hist_range=first["hist_range"],
        capacity=max(first["capacity"], layout.records, 1),
    )
    tensors = {
        "counts": count.round().long(),
        "moments": torch.stack((mean, variance, moments[..., 3].sum(0)), dim=-1).float(),
    }
    if options["with_hist"]:
        tensors["hists"] = hists.reshape(layout.records, len(layout.paths), layout.bins).float()
    scales = [_scale(layout.edges[p][0]) if p in layout.edges else None for p in layout.paths]
    dropped = sum(h["dropped"] for h in headers)
    result.load_state_dict({"paths": layout.paths, "dropped": dropped, "tensors": tensors, "scales": scales})
    rebinned = [path for path, (_, exact) in layout.edges.items() if not exact]
    if rebinned:
        warnings.warn(
            f"histograms of {len(rebinned)} module(s) have different bin edges on different ranks and were "
            f"re-binned onto a common range (approximate): {', '.join(map(repr, rebinned[:5]))}; pass "
            "ActivationStats(hist_range=(low, high)) for exact merges",
            MergeWarning,
            stacklevel=3,
        )
    return result


def _scale(edges: torch.Tensor) -> torch.Tensor:
    """`(scale, shift)` mapping the range of `edges` onto `[0, bins]`, as ActivationStats keeps it."""
    low, high, bins = float(edges[0]), float(edges[-1]), edges.numel() - 1
    scale = bins / (high - low) if high > low else math.inf
    return torch.tensor([scale, -low * scale], dtype=torch.float32)
