"""The keywords of `watch()` and `Watch`: written once here (names, types, defaults, checks), read by both.

`WatchOptions` owns them; `watch()` and `Watch.__init__` take `**options` typed by `options_signature`, which gives
static checkers (through a `ParamSpec`) and `inspect.signature` (through `__signature__`) every keyword explicitly.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch
import torch.nn as nn

from ..callbacks._budget import check_budget
from ..hooks._select import Selector
from ..stats._histogram import check_bins, check_range
from ._sinks import Sink

__all__ = ["GROUPS", "WatchCall", "WatchInit", "WatchOptions", "method_options_signature", "options_signature"]

P = ParamSpec("P")
R = TypeVar("R")

GROUPS = (
    "activations",
    "histograms",
    "output_grads",
    "param_grads",
    "update_ratios",
    "unit_activity",
    "identical_units",
    "attention",
    "residual",
    "optimizer",
)
"""What `watch()` can collect, named after the `WatchResults` fields they fill (all by default; `attention`
wherever attention is found, `residual` wherever the model has repeated blocks, `optimizer` given one)."""


@dataclass(frozen=True, kw_only=True)
class WatchOptions:
    """The keywords of `watch()` and `Watch`, checked when built (see `watch()` for what each one does).

    `groups` is kept as a frozenset, `sinks` as a tuple and `near_zero` as a float.

    Raises:
        ValueError: an option is out of range (the message names it and says what it accepts).
        TypeError: `groups` is a single string instead of a collection of names, a sink lacks `write`/`close`.
    """

    select: Selector = None
    budget: float | None = 0.03
    every: int | None = None
    max_steps: int | None = None
    train_only: bool = True
    groups: Iterable[str] = GROUPS
    capacity: int | None = 1024
    buffer_steps: int = 64
    hist_bins: int = 40
    hist_range: tuple[float, float] | None = None
    near_zero: float = 1e-3
    check_nonfinite: bool | None = None
    sinks: Iterable[Sink] = ()
    doctor: bool = False
    doctor_every: int = 100
    scaler: torch.amp.GradScaler | None = None
    exact: bool = False
    strict: bool | None = None

    def __post_init__(self) -> None:
        if self.every is not None:
            _positive("every", self.every)
        if self.max_steps is not None:
            _positive("max_steps", self.max_steps, " or None (the run's length is not known)")
        budget = check_budget(self.budget, "measure every `every`-th step")
        _positive("buffer_steps", self.buffer_steps)
        _positive("hist_bins", self.hist_bins)
        _positive("doctor_every", self.doctor_every)
        if self.capacity is not None:
            _positive("capacity", self.capacity, " or None (keep every recorded step)")
        hist_range = check_range("hist_range", self.hist_range)
        check_bins("hist_bins", self.hist_bins, automatic=hist_range is None)
        near_zero = self.near_zero
        if not (isinstance(near_zero, (int, float)) and math.isfinite(near_zero) and near_zero >= 0):
            raise ValueError(f"near_zero must be a finite number >= 0, got {near_zero!r}")
        normal: dict[str, object] = {
            "groups": _groups(self.groups),
            "sinks": _sinks(self.sinks),
            "hist_range": hist_range,
        }
        normal |= {"near_zero": float(near_zero), "train_only": bool(self.train_only), "exact": bool(self.exact)}
        checks = self.check_nonfinite
        normal |= {"check_nonfinite": None if checks is None else bool(checks), "doctor": bool(self.doctor)}
        normal |= {"budget": budget}
        for name, value in normal.items():
            object.__setattr__(self, name, value)  # frozen: normalised once, here

    @property
    def is_budgeted(self) -> bool:
        """Whether the steps measured are chosen by the overhead budget (`every` not given)."""
        return self.every is None and self.budget is not None

    @property
    def cadence(self) -> int:
        """Measure every `cadence`-th step at most (1 under a budget, which then chooses among them)."""
        return 1 if self.every is None else self.every

    @property
    def checks_skipped_steps(self) -> bool:
        """Whether the steps not measured are checked for non-finite outputs and gradients (`check_nonfinite`:
        by default with `every`, not under a budget, where a skipped step costs nothing)."""
        return (not self.is_budgeted) if self.check_nonfinite is None else self.check_nonfinite


@dataclass(frozen=True)
class WatchCall(WatchOptions):
    """The parameters of `watch()`: `model`, `optimizer`, then the options (a signature, never built)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None = None


@dataclass(frozen=True)
class WatchInit(WatchOptions):
    """The parameters of `Watch()`: as `watch()`'s, with `model` optional (a signature, never built)."""

    model: nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None


def options_signature(source: Callable[P, Any]) -> Callable[[Callable[..., R]], Callable[P, R]]:
    """Give the decorated `f(..., **options)` the parameters of the dataclass `source`, for static checkers and
    `inspect.signature` (annotations resolved, so `checked()` reads them), keeping `f`'s return annotation."""

    def decorate(function: Callable[..., R]) -> Callable[P, R]:
        function.__signature__ = _resolved(source, function)  # type: ignore[attr-defined]
        return function

    return decorate


def method_options_signature(
    source: Callable[P, Any],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, P], None]]:
    """`options_signature` for an `__init__(self, ..., **options)`."""

    def decorate(function: Callable[..., None]) -> Callable[Concatenate[Any, P], None]:
        signature = _resolved(source, function)
        me = next(iter(inspect.signature(function).parameters.values()))
        function.__signature__ = signature.replace(parameters=[me, *signature.parameters.values()])  # type: ignore[attr-defined]
        return function

    return decorate


def _resolved(source: Callable[..., Any], function: Callable[..., Any]) -> inspect.Signature:
    hints = typing.get_type_hints(source)
    parameters = [p.replace(annotation=hints[p.name]) for p in inspect.signature(source).parameters.values()]
    returns = typing.get_type_hints(function).get("return", inspect.Signature.empty)
    return inspect.Signature(parameters, return_annotation=returns)


def _positive(name: str, value: object, alternative: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int{alternative}, got {value!r}")


def _groups(groups: Iterable[str]) -> frozenset[str]:
    if isinstance(groups, str):
        raise TypeError(f"groups must be a collection of group names such as ({groups!r},), got the string {groups!r}")
    chosen = frozenset(groups)
    unknown = sorted(chosen - set(GROUPS))
    if unknown:
        raise ValueError(f"groups must be names from {GROUPS}, got unknown {unknown}")
    return chosen


def _sinks(sinks: Iterable[Sink]) -> tuple[Sink, ...]:
    chosen = tuple(sinks)
    for sink in chosen:
        if not (callable(getattr(sink, "write", None)) and callable(getattr(sink, "close", None))):
            raise TypeError(
                f"sinks must have write(results) and close() methods (CSVSink, JSONLSink, TensorBoardSink), got "
                f"{type(sink).__name__}"
            )
    return chosen
