"""The reducer contract: push observations, read them back on demand, save and restore the state.

Every reducer keeps its state on the device of the tensors pushed into it and updates it with out-of-place
tensor operations under `torch.no_grad()`, so `push` never waits on the device and never records autograd
history. Reading (`peek`, `dump`, `view`, `dropped`) is where a host-device sync may happen.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch

from .._check import hint_for
from .._loading import class_loader
from .._schema import Const, Field, Int, Record, SchemaError, check, found
from .._transfer import to_device
from ..checkpoint import from_file
from ..stats._spec import accumulate_dtype, wide_dtype
from ._state import load_state, save_state

__all__ = ["Reducer", "accumulate_dtype", "wide_dtype"]  # the dtype rules are the engine's (hookscope.stats)

ReducerT = TypeVar("ReducerT", bound="Reducer")


class Reducer(ABC):
    """Bounded state over a stream of observations; pure tensor state, no hooks.

    Contract: `push(*tensors)` adds one observation; `peek()` returns the current reduced value (`None` before
    the first push); `dump()` everything kept, oldest first, stacked along a new first dimension (`None` when
    empty); `view(step)` the value as of push number `step` (from 0) where the reducer keeps history;
    `clear()` forgets everything; `state_dict()` / `load_state_dict()` and `save(path)` / `Reducer.load(path)`
    (on the class: a new reducer; on a reducer: restored in place) persist it; `pushes` and `dropped` count the
    observations seen and the ones not kept. Pushes are thread-safe.
    """

    keeps_history: ClassVar[bool] = False
    state_kind: ClassVar[str] = "reducer"
    """The kind tag of the files `save` writes (`hookscope.load_state(path, reducer)` reads it)."""
    STATE: ClassVar[Field] = Record()
    """The format of the tensor state (`state_dict()["state"]`), declared by each reducer next to `_state()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pushes = 0
        self._dropped = 0
        self._device = torch.device("cpu")

    @property
    def pushes(self) -> int:
        """How many observations were pushed since construction or the last `clear()`."""
        return self._pushes

    @property
    def dropped(self) -> int:
        """How many pushed observations are not kept (past capacity, or of a shape the state cannot take)."""
        return self._dropped

    @property
    def device(self) -> torch.device:
        """The device the state lives on (that of the last push, or of `to(device)`)."""
        return self._device

    def push(self, *tensors: torch.Tensor) -> None:
        """Add one observation made of `tensors`; never syncs with the device.

        Raises:
            TypeError: no tensor was given, or something else than a tensor.
        """
        _check_tensors(type(self).__name__, tensors)
        with self._lock, torch.no_grad():
            device = tensors[0].device
            if device != self._device:
                self._move(device)
                self._device = device
            self._push(tuple(t.detach() for t in tensors))
            self._pushes += 1

    def __call__(self, *tensors: torch.Tensor) -> None:
        """Push `tensors` (as `push`)."""
        self.push(*tensors)

    @abstractmethod
    def peek(self) -> Any:
        """Return the current reduced value, or `None` before the first push."""

    @abstractmethod
    def dump(self) -> Any:
        """Return everything kept, oldest first, along a new first dimension; `None` when empty."""

    def view(self, step: int) -> Any:
        """Return the value as of push number `step`; only reducers that keep history can.

        Raises:
            TypeError: this reducer keeps no history.
        """
        raise TypeError(
            f"{type(self).__name__} keeps no history, so view(step) cannot look back; use HistoryReducer to keep "
            "every push, or peek() for the current value"
        )

    def clear(self) -> None:
        """Forget every observation and reset the counters."""
        with self._lock:
            self._pushes = 0
            self._dropped = 0
            self._reset()
            self._move(self._device)

    def config(self) -> dict[str, Any]:
        """Return the constructor arguments (JSON-able) that define this reducer."""
        return {}

    def to(self: ReducerT, device: torch.device | str) -> ReducerT:
        """Move the state to `device` and return `self`."""
        target = torch.device(device)
        with self._lock:
            self._move(target)
            self._device = target
        return self

    def state_dict(self) -> dict[str, Any]:
        """Return the whole state: type, config, counters and tensors (snapshots: later pushes rebind, never mutate).

        The tensors are the raw accumulators (for instance count, mean and M2 of `StatsReducer`), so that a
        distributed run can combine them.
        """
        with self._lock:
            return {
                "type": type(self).__name__,
                "config": self.config(),
                "pushes": self._pushes,
                "dropped": self._dropped,
                "state": self._state(),
            }

    def state_schema(self) -> Record:
        """The format of `state_dict()` for this reducer (its type and configuration included)."""
        return Record(
            type=Const(type(self).__name__, "the reducer type that loads it"),
            config=Const(self.config(), "the configuration of the reducer that loads it"),
            pushes=Int(min=0),
            dropped=Int(min=0),
            state=self.STATE,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict()` returned, on this reducer's device; all or nothing.

        Raises:
            ValueError: `state` comes from another reducer type or configuration, or does not fit the format
                (the field is named); the reducer is left as it was.
        """
        self.check_state(state)
        with self._lock:
            self._load(state["state"])
            self._pushes = state["pushes"]
            self._dropped = state["dropped"]
            self._move(self._device)

    def check_state(self, state: Any, at: str = "state") -> None:
        """Check `state` in full against this reducer's format; change nothing.

        Raises:
            SchemaError: the first field that does not fit (a `ValueError`).
        """
        if not isinstance(state, dict):
            raise SchemaError("state", at, f"must be a {type(self).__name__}.state_dict(), got {found(state)}")
        seen = (state.get("type"), state.get("config"))
        if seen != (type(self).__name__, self.config()):
            raise SchemaError(
                "state",
                f"{at}.type" if seen[0] != type(self).__name__ else f"{at}.config",
                f"must come from a {type(self).__name__} with config {self.config()}, got {seen[0]} with config "
                f"{seen[1]}; build the reducer with the same arguments before loading",
            )
        check(self.state_schema(), state, at=at, bind=self._sizes())

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the state atomically to `path` (safetensors + JSON) and return the path."""
        return save_state(path, self.state_dict(), kind=self.state_kind)

    @class_loader
    def load(cls: type[Reducer], path: str | os.PathLike[str]) -> Reducer:
        """Return a new reducer of the type and configuration `save(path)` wrote, with its state (never unpickles).

        On the class: `r = StatsReducer.load(path)` (or `Reducer.load(path)`, whatever type the file holds). On a
        reducer, `r.load(path)` restores the file into `r`, in place (as the first releases did; the same as
        `hookscope.load_state(path, r)`). Only hookscope's own reducer types are built (looked up by name), or
        `cls` itself when the file names it.

        Raises:
            ValueError: the file is not a reducer file, names a reducer type that is not hookscope's (nor `cls`),
                or holds a type that is not `cls` or a subclass, or a configuration or state that does not fit.
        """
        state = load_state(path, kind=cls.state_kind)
        with from_file(path):
            reducer = _build(cls, state)
            reducer.load_state_dict(state)
        return reducer

    @abstractmethod
    def _push(self, tensors: tuple[torch.Tensor, ...]) -> None:
        """Fold one observation (detached, on the state's device) into the state."""

    @abstractmethod
    def _reset(self) -> None:
        """Reset the tensor state to empty."""

    @abstractmethod
    def _move(self, device: torch.device) -> None:
        """Move every state tensor to `device`."""

    @abstractmethod
    def _state(self) -> dict[str, Any]:
        """Return the tensor state (tensors, lists of tensors, JSON-able values)."""

    @abstractmethod
    def _load(self, state: dict[str, Any]) -> None:
        """Restore the tensor state returned by `_state()`, already checked against `STATE` (cannot fail)."""

    def _sizes(self) -> dict[str, int]:
        """Sizes `STATE`'s symbols take in this reducer (from its configuration)."""
        return {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        arguments = ", ".join(f"{name}={value!r}" for name, value in self.config().items())
        return f"{type(self).__name__}({arguments})"


hint_for(Reducer, "a reducer such as StatsReducer(), HistogramReducer(bins=40) or HistoryReducer()")


def move(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Return `tensor` on `device`, float64 narrowed to float32 where `device` has no float64 (from the host: without
    a sync, as the first push moves a fresh state)."""
    dtype = torch.float32 if tensor.dtype == torch.float64 and device.type == "mps" else tensor.dtype
    if tensor.device.type == "cpu" and device.type != "cpu":
        return to_device(tensor.to(dtype), device)
    return tensor.to(device=device, dtype=dtype)


def single(name: str, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Return the one tensor of an observation, for reducers that follow one tensor over time.

    Raises:
        TypeError: the observation holds several tensors.
    """
    if len(tensors) != 1:
        raise TypeError(
            f"{name}.push takes one tensor per observation, got {len(tensors)}; give the monitor a map_ that "
            "returns one tensor, or use a reducer that pools values (StatsReducer, HistogramReducer, ReservoirReducer)"
        )
    return tensors[0]


def _build(cls: type[Reducer], state: dict[str, Any]) -> Reducer:
    """A new reducer of the type and configuration `state` names: hookscope's own types only, or `cls` itself."""
    from ._types import REDUCER_TYPES  # the fixed table (its modules import this one)

    name, config = state.get("type"), state.get("config")
    kind = cls if name == cls.__name__ else REDUCER_TYPES.get(name) if isinstance(name, str) else None
    if kind is None:
        raise SchemaError(
            "state", "state.type", f"must name one of hookscope's reducers {sorted(REDUCER_TYPES)}, got {name!r}"
        )
    if not issubclass(kind, cls):
        raise SchemaError("state", "state.type", f"must be a {cls.__name__}, got {name}; use {name}.load(path)")
    if not isinstance(config, dict) or not all(isinstance(key, str) for key in config):
        raise SchemaError("state", "state.config", f"must be a dict of constructor arguments, got {found(config)}")
    try:
        return kind(**config)
    except TypeError as err:
        raise SchemaError("state", "state.config", f"must be the arguments of {name}, got {config!r} ({err})") from None


def _check_tensors(name: str, tensors: tuple[Any, ...]) -> None:
    if not tensors:
        raise TypeError(f"{name}.push takes at least one tensor, got none")
    for index, tensor in enumerate(tensors):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"{name}.push takes tensors, got {type(tensor).__name__} at position {index}; wrap numbers with "
                "torch.tensor(...)"
            )
