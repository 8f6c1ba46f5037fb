"""Merge `ActivationStats` records of several ranks: record k of every rank (its k-th observed batch) becomes
record k of the result, each module's records combined by the engine (Chan's formulas, counts summed), histograms
re-binned exactly to the module's widest range on any rank and summed.

Modules are unioned over ranks (a rank that never saw a module adds nothing to it); ranks with fewer records add
nothing to the later ones. The sequence is `hookscope.distributed.merge_parts`'s, shared with every merge.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._check import NON_EMPTY, TIMEOUT, checked
from ..distributed import DEFAULT_TIMEOUT, combine_parts, combine_ranks, merge_parts
from ..stats._histogram import rebin, widest_exponent
from ..stats._record import RECORD, empty
from ._activation_stats import ActivationStats

__all__ = ["combine_activation_stats", "merge_activation_stats"]

_OPTIONS = ("near_zero", "with_hist", "hist_bins", "hist_range", "exact")
_OPS = {"records": "gather", "hists": "sum"}


@checked(timeout=TIMEOUT)
def merge_activation_stats(stats: ActivationStats, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> ActivationStats:
    """Merge every rank's `stats` into a new `ActivationStats` (not attached); a collective: every rank calls it.

    Every rank joins the same collectives, also a rank with no records or other modules, each with `timeout`;
    every rank gets the same merged records. Outside a distributed run: `combine_activation_stats`.

    Raises:
        TypeError: `stats` is not `ActivationStats`.
        ValueError: the ranks' `near_zero`, `with_hist`, `hist_bins`, `hist_range` or `exact` differ (raised on
            every rank alike).
    """
    if not isinstance(stats, ActivationStats):
        raise TypeError(f"stats must be ActivationStats, got {type(stats).__name__}")
    return _merge(stats, None, timeout)


@checked(parts=NON_EMPTY)
def combine_activation_stats(parts: Sequence[ActivationStats]) -> ActivationStats:
    """Merge the `ActivationStats` of several ranks given together (rank 0 first); no collective.

    Raises:
        ValueError: `parts` is empty, or their `near_zero`, `with_hist`, `hist_bins`, `hist_range` or `exact`
            differ.
        TypeError: an element of `parts` is not `ActivationStats`.
    """
    parts = list(parts)
    if not parts:
        raise ValueError("parts must hold at least one ActivationStats, got an empty sequence")
    for part in parts:
        if not isinstance(part, ActivationStats):
            raise TypeError(f"parts must hold ActivationStats only, got {type(part).__name__}")
    return _merge(None, parts, DEFAULT_TIMEOUT)


def _merge(
    own: ActivationStats | None, parts: list[ActivationStats] | None, timeout: datetime.timedelta
) -> ActivationStats:
    steps: dict[str, Any] = {"header": _header, "layout": _Layout.build, "pack": _pack, "ops": _OPS}
    steps["assemble"] = _assemble
    if own is not None:
        return merge_parts(own, timeout=timeout, **steps)  # type: ignore[no-any-return]
    return combine_parts(parts or [], **steps)  # type: ignore[no-any-return]


def _header(stats: ActivationStats) -> dict[str, Any]:
    """What every rank needs to know of one rank's records: modules, record count, options, histogram ranges."""
    state = stats.state_dict()
    exponents = state["tensors"].get("exponents")
    columns = exponents.T.tolist() if exponents is not None else [[] for _ in state["paths"]]
    widest = [widest_exponent(column) for column in columns]
    return {
        "paths": list(state["paths"]),
        "records": int(state["records"]),
        "dropped": int(state["dropped"]),
        "options": {name: getattr(stats, name) for name in _OPTIONS},
        "every": stats.every,
        "capacity": stats.capacity,
        "exponents": dict(zip(state["paths"], widest, strict=True)),
    }


@dataclass
class _Layout:
    """The union of modules and records over ranks, and each module's widest histogram range."""

    paths: list[str]
    records: int
    exponents: list[int]

    @classmethod
    def build(cls, headers: list[dict[str, Any]]) -> _Layout:
        for option in _OPTIONS:
            values = [h["options"][option] for h in headers]
            if any(v != values[0] for v in values):
                raise ValueError(
                    f"{option} must be the same on every rank, got {values} (rank order); create ActivationStats "
                    "with the same arguments on every rank"
                )
        paths = list(dict.fromkeys(p for h in headers for p in h["paths"]))
        widest = [widest_exponent(h["exponents"][p] for h in headers if p in h["exponents"]) for p in paths]
        return cls(paths, max(h["records"] for h in headers), widest)


def _pack(stats: ActivationStats, header: dict[str, Any], layout: _Layout) -> dict[str, torch.Tensor]:
    """This rank's records and histograms aligned to `layout` (empty where it saw nothing)."""
    state, options = stats.state_dict(), header["options"]
    rows, width = header["records"], options["hist_bins"] + 2
    records = empty((layout.records, len(layout.paths)), saturating=True)
    records[..., RECORD.index("saturated")] = float("nan")
    hists = torch.zeros(layout.records, len(layout.paths), width, dtype=torch.float64)
    tensors = state["tensors"]
    columns = [layout.paths.index(p) for p in header["paths"]]
    if "records" in tensors and rows:
        records[:rows, columns] = tensors["records"].double()
    if "hists" in tensors and rows:
        target = torch.tensor([layout.exponents[c] for c in columns])
        own = tensors["hists"].double()
        if options["hist_range"] is None:
            own = rebin(own, tensors["exponents"], target.expand(rows, -1))
        hists[:rows, columns] = own
    return {"records": records, "hists": hists}


def _assemble(headers: list[dict[str, Any]], layout: _Layout, tables: dict[str, torch.Tensor]) -> ActivationStats:
    """A new `ActivationStats` holding the merged records."""
    first, options = headers[0], headers[0]["options"]
    result = ActivationStats(
        with_hist=options["with_hist"],
        every=first["every"],
        near_zero=options["near_zero"],
        hist_bins=options["hist_bins"],
        hist_range=options["hist_range"],
        capacity=max(first["capacity"], layout.records, 1),
        exact=options["exact"],
    )
    tensors = {"records": combine_ranks(tables["records"])}
    if options["with_hist"]:
        tensors["hists"] = tables["hists"]
        tensors["exponents"] = torch.tensor(layout.exponents, dtype=torch.int64).expand(layout.records, -1).clone()
    state = {"paths": layout.paths, "dropped": sum(h["dropped"] for h in headers), "records": layout.records}
    result.load_state_dict({**state, "tensors": tensors})
    return result
