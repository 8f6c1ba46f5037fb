"""One monitor per selected module, keyed by normalized module path."""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch.nn as nn

from .._check import aliases, check_callable, checked
from .._errors import closest_names
from .._schema import Const, MapOf, Part, Record, SchemaError, check, found
from ..checkpoint import from_file
from ..hooks._select import Selector, choose_modules
from ..reducers._state import load_state, save_state
from ._base import Monitor, MonitorConstructor

__all__ = ["MonitorPool"]

STATE = Record(type=Const("MonitorPool", "a pool's state"), monitors=MapOf(Part("a monitor")))
"""The format of `MonitorPool.state_dict()`; each monitor checks its own part (`Monitor.check_state`)."""


class MonitorPool(Mapping[str, Monitor]):
    """Build a monitor with `constructor(attr, module)` for every module `select` picks, keyed by its path.

    Paths are normalized (`module.` of DDP, `_orig_mod.` of torch.compile dropped), so a pool built on a
    model and one built on its wrapped form have the same keys. The pool is a read-only mapping
    `path -> Monitor`, a context manager (leaving it deregisters every monitor), and persists as one file.
    `register(model)` on another model (for instance after a restart) builds fresh monitors and carries over
    the state of those whose path was already in the pool.

    Args:
        constructor: A `partialconstructor(...)` of a monitor class, or any `(attr, module) -> Monitor`.
        model: The model to select modules from; `None` to `register(model)` later.
        select: Which modules (see `hookscope.hooks.select_modules`); `None` picks modules with parameters.
        attr: Passed to the constructor: a submodule path for input/output/gradient monitors (`""`: the
            module itself), an attribute for state and difference monitors, a parameter name for
            `ParameterGradMonitor`.

    Raises:
        TypeError: `constructor` is not callable.

    Example:
        >>> import torch, torch.nn as nn
        >>> from hookscope import OutputMonitor, StatsReducer
        >>> model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
        >>> with MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), model) as pool:
        ...     _ = model(torch.randn(8, 3))
        >>> sorted(pool), int(pool["2"].peek().count)
        (['0', '2'], 8)
    """

    state_kind: ClassVar[str] = "monitor_pool"
    """The kind tag of the files `save` writes (`hookscope.load_state(path, obj)` reads it)."""

    @aliases(selector="select")
    @checked()
    def __init__(
        self, constructor: MonitorConstructor, model: nn.Module | None = None, select: Selector = None, attr: str = ""
    ) -> None:
        check_callable("constructor", constructor, 2, "constructor(attr, module) -> Monitor")
        self.constructor = constructor
        self.select = select
        self.attr = attr
        self._monitors: dict[str, Monitor] = {}
        self._model: weakref.ref[nn.Module] | None = None
        if model is not None:
            self.register(model)

    # ----------------------------------------------------------------- mapping
    def __getitem__(self, path: str) -> Monitor:
        try:
            return self._monitors[path]
        except KeyError:
            close = closest_names(path, self._monitors)
            hint = f"; closest: {', '.join(repr(c) for c in close)}" if close else ""
            raise KeyError(f"path must be a monitored module path, got {path!r}{hint}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._monitors)

    def __len__(self) -> int:
        return len(self._monitors)

    # ----------------------------------------------------------------- registration
    @property
    def model(self) -> nn.Module | None:
        """The model registered last (held weakly)."""
        return None if self._model is None else self._model()

    @property
    def is_registered(self) -> bool:
        """Whether any monitor of the pool has its hooks in place."""
        return any(monitor.is_registered for monitor in self._monitors.values())

    def register(self, model: nn.Module | None = None) -> MonitorPool:
        """Attach to `model` (or re-attach to the model registered last) and return `self`.

        On the same model, the pool's monitors are re-registered; on another one, a monitor is built for each
        selected module and takes over the state of the monitor that had its path. Either way, if anything
        fails, every hook placed by this call is removed and the pool is left as it was.

        Raises:
            RuntimeError: no model is given and none was registered before (or it was freed).
            ValueError: the selector names a path the model does not have.
        """
        target = model if model is not None else self.model
        if target is None:
            raise RuntimeError("MonitorPool.register() needs a model: none was registered before; call register(model)")
        if target is self.model and self._monitors:
            return self._reregister()
        return self._build(target)

    def _reregister(self) -> MonitorPool:
        placed = []
        try:
            for monitor in self._monitors.values():
                if not monitor.is_registered:
                    placed.append(monitor.register())
        except BaseException:
            for monitor in placed:
                monitor.deregister()
            raise
        return self

    def _build(self, model: nn.Module) -> MonitorPool:
        built: dict[str, Monitor] = {}
        try:
            for path, module in choose_modules(model, self.select, "select"):
                built[path] = monitor = self.constructor(self.attr, module)
                if not isinstance(monitor, Monitor):
                    raise TypeError(f"constructor must return a Monitor, got {type(monitor).__name__} for {path!r}")
                monitor.path = path
                if path in self._monitors:
                    monitor.load_state_dict(self._monitors[path].state_dict())
        except BaseException:
            for monitor in built.values():
                if isinstance(monitor, Monitor):
                    monitor.deregister()
            raise
        self.deregister()
        self._monitors = {**{p: m for p, m in self._monitors.items() if p not in built}, **built}
        self._model = weakref.ref(model)
        return self

    def deregister(self) -> None:
        """Remove every monitor's hooks; their state is kept."""
        for monitor in self._monitors.values():
            monitor.deregister()

    def attach(self, model: nn.Module | None = None) -> MonitorPool:
        """Same as `register(model)`."""
        return self.register(model)

    def detach(self) -> None:
        """Same as `deregister()`."""
        self.deregister()

    def remove(self) -> None:
        """Same as `deregister()`: every attachment's handle has `remove()`."""
        self.deregister()

    def __enter__(self) -> MonitorPool:
        return self if self.is_registered else self.register()

    def __exit__(self, *exc_info: object) -> None:
        self.deregister()

    # ----------------------------------------------------------------- reading
    def peek(self) -> dict[str, Any]:
        """Return every monitor's current value, by path."""
        return {path: monitor.peek() for path, monitor in self._monitors.items()}

    def dump(self) -> dict[str, Any]:
        """Return everything every monitor kept, by path."""
        return {path: monitor.dump() for path, monitor in self._monitors.items()}

    def clear(self, **kwargs: Any) -> None:
        """Clear every monitor (`kwargs` go to each reducer's `clear`)."""
        for monitor in self._monitors.values():
            monitor.clear(**kwargs)

    # ----------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Return every monitor's state, by path."""
        return {"type": type(self).__name__, "monitors": {p: m.state_dict() for p, m in self._monitors.items()}}

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Restore every monitor's state from `state_dict()`, by path.

        Every monitor's state is checked before any is loaded: a refused state leaves the whole pool as it was.

        Raises:
            TypeError: `strict` is not a bool.
            ValueError: with `strict`, the saved paths and the pool's differ (both lists are given); or a
                monitor's state does not fit (another type or reducer, a malformed field: the field is named).
        """
        if not isinstance(strict, bool):
            raise TypeError(f"strict must be a bool, got {strict!r}")
        if not isinstance(state, dict):
            raise SchemaError("state", "state", f"must be a MonitorPool.state_dict(), got {found(state)}")
        check(STATE, state)
        saved = state["monitors"]
        missing, unexpected = sorted(set(self._monitors) - set(saved)), sorted(set(saved) - set(self._monitors))
        if strict and (missing or unexpected):
            raise SchemaError(
                "state",
                "state.monitors",
                f"must hold the pool's module paths: missing {missing}, unexpected {unexpected}; select the same "
                "modules, or pass strict=False to load the common ones",
            )
        common = [(path, monitor) for path, monitor in self._monitors.items() if path in saved]
        for path, monitor in common:
            monitor.check_state(saved[path], at=f"state.monitors[{path!r}]")
        for path, monitor in common:
            monitor.load_state_dict(saved[path])

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write every monitor's state atomically to one file (safetensors + JSON) and return the path."""
        return save_state(path, self.state_dict(), kind=self.state_kind)

    def load(self, path: str | os.PathLike[str], strict: bool = True) -> None:
        """Restore the state `save(path)` wrote into this pool, in place (as `hookscope.load_state(path, pool)`)."""
        state = load_state(path, kind=self.state_kind)
        with from_file(path):
            self.load_state_dict(state, strict=strict)

    def __getstate__(self) -> dict[str, Any]:
        """A deep copy or a pickle is an unregistered pool of unattached copies of the monitors, same state."""
        return {**self.__dict__, "_model": None}

    def __repr__(self) -> str:
        return f"MonitorPool({len(self)} monitors: {list(self._monitors)[:5]}{'...' if len(self) > 5 else ''})"
