"""The format of `ActivationStats.state_dict()` (`STATE`): its records as the engine keeps them, checked in full."""

from __future__ import annotations

from .._schema import FLOAT, INT, Int, ListOf, Record, Rule, Str, Tensor
from ..stats._record import RECORD

__all__ = ["STATE"]

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
    optional={"batches": ListOf(Int(min=0))},  # the training batch of each record (absent: saved before it was)
    rules=[
        Rule(
            "records",
            lambda s: all(t.shape[0] == s["records"] for t in s["tensors"].values()),
            "must be the number of rows of every tensor",
        ),
        Rule("batches", lambda s: len(s.get("batches", ())) in (0, s["records"]), "must hold one batch per record"),
    ],
)
"""The format of `ActivationStats.state_dict()`; `bins` is the callback's `hist_bins`."""
