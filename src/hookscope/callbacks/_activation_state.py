"""`ActivationStats.state_dict()` / `load_state_dict()`: its records as the engine keeps them, checked in full."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .._schema import FLOAT, INT, Int, ListOf, Record, Rule, Str, Tensor, check
from ..stats import RECORD

if TYPE_CHECKING:
    from ._activation_stats import ActivationStats

__all__ = ["STATE", "activation_state", "load_activation_state"]

STATE = Record(
    paths=ListOf(Str(), length="modules"),
    dropped=Int(min=0),
    records=Int(min=0),
    tensors=Record(
        optional={
            "records": Tensor(FLOAT, shape=("records", "modules", len(RECORD))),  # the engine's moments records
            "hists": Tensor(FLOAT, shape=("records", "modules", "bins+2")),  # counts, below and above a range
            "exponents": Tensor(INT, shape=("records", "modules")),  # the range of each histogram
        },
        rules=[Rule("hists", lambda t: ("hists" in t) == ("exponents" in t), "and exponents come together")],
    ),
    rules=[
        Rule(
            "records",
            lambda s: all(t.shape[0] == s["records"] for t in s["tensors"].values()),
            "must be the number of rows of every tensor",
        )
    ],
)
"""The format of `ActivationStats.state_dict()`; `bins` is the callback's `hist_bins`."""


def activation_state(stats: ActivationStats) -> dict[str, Any]:
    """The records of `stats` on the CPU: per record and module its moments record, histogram and exponent."""
    stats._settle()
    table, records = stats._table, stats._records
    tensors: dict[str, torch.Tensor] = {}
    if table is not None and table.records is not None:
        tensors["records"] = table.records[:records].cpu().clone()
        if table.hists is not None and table.exponents is not None:
            tensors["hists"] = table.hists[:records].cpu().clone()
            tensors["exponents"] = table.exponents[:records].cpu().clone()
    return {"paths": list(stats.paths), "dropped": stats.dropped, "records": records, "tensors": tensors}


def load_activation_state(stats: ActivationStats, state: dict[str, Any]) -> None:
    """Check `state` in full, then make it the records of `stats` (a refused state changes nothing).

    Raises:
        ValueError: the state does not fit the format (the field is named), or was saved for other modules.
    """
    check(STATE, state, bind={"bins": stats.hist_bins})
    if stats.paths and list(state["paths"]) != stats.paths:
        raise ValueError(f"state must be for modules {stats.paths}, got {state['paths']}")
    stats.paths, stats.dropped = list(state["paths"]), state["dropped"]
    stats._records, stats._cache = state["records"], None
    table = stats._table = stats._new_table()
    tensors = state["tensors"]
    if "records" in tensors and stats._records:
        table.allocate(max(stats._records, 1), torch.device("cpu"))
        if table.records is not None:
            table.records[: stats._records] = tensors["records"]
        if table.hists is not None and table.exponents is not None and "hists" in tensors:
            table.hists[: stats._records] = tensors["hists"]
            table.exponents[: stats._records] = tensors["exponents"]
