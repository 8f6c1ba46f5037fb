"""The format of `Watch.state_dict()` (`STATE`): counters, kept steps and device extras, to resume a run.

Each part of a watch saves and loads its own state (`Stepper.state_dict`, `Recorder.state_dict`); this module
puts them in one checked format. A state is checked in full (`check_state`) before anything is loaded, and
against the watched modules (`check_fits`: paths, parameter names and shapes, unit counts); `Watch` applies it
at once, or keeps it, whole, for the modules of the next `on_fit_start`. A refused state leaves the watch as it
was.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

import torch

from .._schema import (
    FLOAT,
    INT,
    Bool,
    Const,
    Either,
    Float,
    Int,
    ListOf,
    MapOf,
    Optional,
    Record,
    Rule,
    SchemaError,
    Str,
    Tensor,
    check,
    found,
)
from ..results._results import ACTIVATION_STATS, FIRST_NONFINITE, GRAD_STATS, OPTIMIZER_STATS
from ._buffers import Chunk

if TYPE_CHECKING:
    from ._recorder import Recorder

__all__ = ["STATE", "check_fits", "check_state", "state_of", "stepper_state"]

_VERSION = 3  # 2: histogram ranges as exponents, unit activity as the engine's table keeps it; 3: attention,
# residual stream and optimizer tables

_ROWS = ("float64",)  # the kept steps' dtype (`Chunk`)
_TABLE = Record(
    steps=Tensor(INT, shape=("steps",)),
    activations=Tensor(_ROWS, shape=("steps", "modules", len(ACTIVATION_STATS))),
    histograms=Tensor(_ROWS, shape=("steps", "modules", "bins+2")),  # the bins, then below and above a range
    exponents=Tensor(INT, shape=("steps", "modules")),  # each row's range (`hookscope.stats`)
    output_grads=Tensor(_ROWS, shape=("steps", "modules", len(GRAD_STATS))),
    param_grads=Tensor(_ROWS, shape=("steps", "params", len(GRAD_STATS))),
    update_ratios=Tensor(_ROWS, shape=("steps", "params")),
    losses=Tensor(_ROWS, shape=("steps",)),
    residual=Tensor(_ROWS, shape=("steps", "blocks", 4)),
    optimizer=Tensor(_ROWS, shape=("steps", "params", "*")),  # `OPTIMIZER_STATS`; 3 columns in older states
    attention=MapOf(Tensor(_ROWS, shape=("steps", "*", 4))),
    has_loss=Bool(),
    optional={"loss_counts": Tensor(_ROWS, shape=("steps",))},  # absent from older states
    rules=[
        Rule(
            "optimizer",
            lambda t: t["optimizer"].shape[-1] in (len(OPTIMIZER_STATS) - 1, len(OPTIMIZER_STATS)),
            f"must have {len(OPTIMIZER_STATS)} columns ({', '.join(OPTIMIZER_STATS)}; older states lack the last)",
        )
    ],
)
_RECORDER_STATE = Record(
    paths=ListOf(Str(), length="modules"),
    param_names=ListOf(Str(), length="params"),
    dropped=MapOf(Int(min=0)),
    observed=ListOf(Bool(), length="modules"),
    forward_order=ListOf(Int(min=0, below="modules")),
    backward_order=ListOf(Int(min=0, below="modules")),
    units=ListOf(Optional(Tensor(FLOAT, shape=(2, "*"))), length="modules"),  # active and seen values per unit
    first=Optional(Tensor(INT, shape=(2, "modules"))),
    residual_paths=ListOf(Str(), length="blocks"),
    attention_paths=ListOf(Str()),
    optional={"param_shapes": ListOf(ListOf(Int(min=0)), length="params")},  # absent from older states
)
_BUDGET = Record(
    steps=Int(min=0),
    own=Float(),
    total=Float(),
    measured=ListOf(Float(), length=2),  # steps measured after the warm-up, and their seconds
    skipped=ListOf(Float(), length=2),  # steps left alone, and their seconds
    largest=Float(),
    typical=Optional(Float()),
    credit=Float(),
)
_LOSSES = Record(
    steps=Tensor(INT, shape=("logged",)),
    sums=Tensor(("float64",), shape=("logged",)),
    calls=Tensor(("float64",), shape=("logged",)),
    stride=Int(min=1),
)
STATE = Record(
    version=Const(_VERSION, "the Watch.state_dict() version this hookscope reads"),
    batches=Int(min=0),
    optimizer_steps=Int(min=0),
    step=Int(min=-1),
    recorded=Int(min=0),
    warned_unobserved=Bool(),
    first=FIRST_NONFINITE,
    stride=Int(min=1),
    capacity_dropped=Int(min=0),
    table=Optional(_TABLE),
    recorder=Optional(_RECORDER_STATE),
    optional={
        "skipped": ListOf(Int(min=0)),
        "labelled": ListOf(ListOf(Either(Str(), Int(min=0)), length=2)),  # [label, step] pairs
        "losses": _LOSSES,  # every step's logged loss (`LossLog`); absent from older states
        "budget": _BUDGET,  # what the overhead budget learned and counted (`Budget`); absent from older states
    },
    rules=[Rule("recorder", lambda s: s["table"] is None or s["recorder"] is not None, "is missing (table is there)")],
)
"""The format of `Watch.state_dict()`; `bins` is the watch's `hist_bins`."""


def state_of(stepper: dict[str, Any], recorder: Recorder | None) -> dict[str, Any]:
    """The state of a watch in the format `STATE`, from its stepper's `state_dict` and its recorder."""
    table = stepper["table"]
    state = {"version": _VERSION, **stepper}
    state["table"] = None if table is None else {f.name: getattr(table, f.name) for f in fields(Chunk)}
    state["recorder"] = None if recorder is None else recorder.state_dict()
    return state


def stepper_state(state: dict[str, Any]) -> dict[str, Any]:
    """The stepper's part of a checked `STATE` (for `Stepper.load_state_dict`)."""
    table = None if state["table"] is None else Chunk(**_with_learning_rate(state["table"]))
    return {**{k: v for k, v in state.items() if k not in ("version", "recorder")}, "table": table}


def _with_learning_rate(table: dict[str, Any]) -> dict[str, Any]:
    """`table` with a NaN learning-rate column added to an older state's optimizer table (it did not keep it)."""
    optimizer = table["optimizer"]
    if optimizer.shape[-1] == len(OPTIMIZER_STATS):
        return table
    unknown = torch.full((*optimizer.shape[:-1], 1), float("nan"), dtype=optimizer.dtype)
    return {**table, "optimizer": torch.cat((optimizer, unknown), dim=-1)}


def check_state(state: Any, bins: int) -> None:
    """Check `state` in full against `STATE` for a watch of `bins` histogram bins.

    Raises:
        ValueError: `state` is not a watch state of this version or does not fit the format (the field is named).
    """
    if not isinstance(state, dict) or state.get("version") != _VERSION:
        raise SchemaError(
            "state",
            "state.version",
            f"must be {_VERSION}: state must be a Watch.state_dict() of version {_VERSION}, got {found(state)}",
        )
    check(STATE, state, bind={"bins": bins})


def check_fits(saved: dict[str, Any] | None, recorder: Recorder) -> None:
    """Check that a recorder state `saved` was saved for the modules and widths of `recorder`.

    Raises:
        ValueError: it was saved for other modules, parameter shapes or unit counts (the first difference named).
    """
    if saved is None:
        return
    same_blocks = saved["residual_paths"] == recorder.residual.paths
    if saved["paths"] != recorder.paths or saved["param_names"] != recorder.param_names or not same_blocks:
        raise ValueError(
            f"state must be saved from a watch of the same modules, got paths {saved['paths'][:5]}... for a "
            f"watch of {recorder.paths[:5]}... (select the same modules as the run that saved it)"
        )
    shapes = saved.get("param_shapes")
    current = [list(shape) for shape in recorder.param_shapes]
    if shapes is not None and shapes != current:
        index = next(i for i, (a, b) in enumerate(zip(shapes, current, strict=True)) if a != b)
        raise ValueError(
            f"state must be saved from a model of the same widths, got parameter {saved['param_names'][index]!r} "
            f"of shape {tuple(shapes[index])} for one of shape {tuple(current[index])} (load it into the model "
            "that saved it)"
        )
    slots = recorder.buffers.acts.units.slots
    for path, units, now in zip(saved["paths"], saved["units"], slots, strict=True):
        if units is not None and now is not None and units.shape[-1] != now[1]:
            raise ValueError(
                f"state must be saved from a model of the same widths, got {units.shape[-1]} units for module "
                f"{path!r}, which has {now[1]}"
            )
