"""The monitor base: where (one module), when (train/eval gating), what (filter_, map_) and a reducer.

A monitor holds its module through a weak reference and places its hooks through `hookscope.hooks`, so the
registry lists them and `deregister()` (or leaving a `with` block) removes exactly those. As in inferno, the hooks
hold the monitor weakly and a `weakref.finalize` removes them when the monitor is freed: a monitor nobody keeps
stops recording and leaves no hook behind. A deep copy or a pickle of the model (EMA teachers,
`torch.save(model)`) carries none of its hooks. A failure of the monitor's own code (its reducer, its defaults) is
counted in `counts["error"]` and warned about once, or raised with `strict=True`; a failure of the user's
`filter_` or `map_` is raised (`UserHookError`, naming the monitor and the module path).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch.nn as nn

from .._check import checked
from .._errors import UserHookError, closest_names
from .._schema import Const, Int, Part, Record, SchemaError, check, found
from ..checkpoint import from_file
from ..hooks import HookHandle, register_module_hook
from ..hooks._calls import HookErrors
from ..hooks._guards import check_hookable
from ..hooks._tree import tensor_leaves
from ..reducers._base import Reducer
from ..reducers._state import load_state, save_state
from ._parts import Construct

__all__ = ["COUNTERS", "TAG", "Monitor", "MonitorConstructor"]

TAG = "hookscope.monitor"
COUNTERS = ("recorded", "filtered", "gated", "incomplete", "error")
_TRANSIENT = ("_lock", "_observed", "_handles", "_pending", "_parameter", "_finalizer")  # per process, attachment
MonitorT = TypeVar("MonitorT", bound="Monitor")
MonitorConstructor = Callable[[str, nn.Module], "Monitor"]


class Monitor:
    """Record what happens at one module into a reducer, through hooks; base of every monitor.

    Args:
        reducer: Where observations go (each monitor owns its reducer).
        module: The module to watch; `None` to `register(module)` later.
        train_update: Record while the module is in train mode.
        eval_update: Record while the module is in eval mode.
        prepend: Run before the hooks already on the module.
        filter_: `filter_(observation) -> bool`; `False` skips the observation (counted in `counts["filtered"]`).
        map_: `map_(observation) -> tensor or tuple of tensors`, pushed into the reducer.
        strict: Raise failures of the monitor's own code (the reducer) instead of counting them; `None` reads
            `HOOKSCOPE_STRICT`.
        prehook: inferno's: a forward pre-hook `(module, args)`, or the name of a method of the monitor, that the
            base `Monitor` places (subclasses place their own hooks and leave it `None`).
        posthook: inferno's: a forward hook `(module, args, output)`, or the name of a method, likewise.

    Every hook call that reaches the module either records, or is counted in `counts` as filtered, gated
    (train/eval), incomplete (the forward raised) or error. A failure inside `filter_` or `map_` is re-raised
    as a `UserHookError` (a `RuntimeError`) naming the monitor and the module path; one inside the reducer is
    counted in `counts["error"]` and warned about once, or raised the same way when strict.

    Raises:
        TypeError: `reducer` is not a `Reducer`, or a flag is not a bool.
    """

    state_kind: ClassVar[str] = "monitor"
    """The kind tag of the files `save` writes (`hookscope.load_state(path, obj)` reads it)."""

    @classmethod
    def partialconstructor(
        cls: type[MonitorT],
        reducer: Reducer,
        train_update: bool = True,
        eval_update: bool = True,
        prepend: bool = False,
        filter_: Callable[..., bool] | None = None,
        map_: Callable[..., Any] | None = None,
    ) -> Callable[[str, nn.Module], MonitorT]:
        """Return `(attr, module) -> monitor` watching submodule `attr` of `module` (`""`: itself).

        Every argument is passed through; each monitor gets its own copy of `reducer`. Monitors whose
        constructor takes more (`StateMonitor`, `DifferenceMonitor`, `ParameterGradMonitor`) override this.
        """

        return Construct(cls, reducer, (train_update, eval_update, prepend, filter_, map_), attr_is_argument=False)

    @checked()
    def __init__(
        self,
        reducer: Reducer,
        module: nn.Module | None = None,
        train_update: bool = True,
        eval_update: bool = True,
        prepend: bool = False,
        filter_: Callable[..., bool] | None = None,
        map_: Callable[..., Any] | None = None,
        *,
        strict: bool | None = None,
        prehook: str | Callable[..., Any] | None = None,
        posthook: str | Callable[..., Any] | None = None,
    ) -> None:
        self.reducer = reducer
        self.prehook, self.posthook = self._check_hook("prehook", prehook), self._check_hook("posthook", posthook)
        self.train_update, self.eval_update, self.prepend = train_update, eval_update, prepend
        self.filter_ = filter_  # None: the class default (kept apart to avoid a monitor -> bound method cycle)
        self.map_ = map_
        self._observed: weakref.ref[nn.Module] | None = None
        self._lifetime()
        self._path: str | None = None
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._lock = threading.Lock()
        self.errors = HookErrors(type(self).__name__, strict, self._bump, counter="counts['error']")
        if module is not None:
            self.register(module)

    # ----------------------------------------------------------------- registration
    def _lifetime(self) -> None:
        """Hooks that die with the monitor: a finalizer removes them when it is freed (it holds the list, not the
        monitor, and the hooks hold the monitor weakly)."""
        self._handles: list[HookHandle] = []
        self._finalizer = weakref.finalize(self, _remove_all, self._handles)

    @property
    def module(self) -> nn.Module | None:
        """The module watched (or last watched); `None` when there is none or it was freed."""
        return None if self._observed is None else self._observed()

    @property
    def is_registered(self) -> bool:
        """Whether the monitor's hooks are in place on a module that is still alive."""
        return self.module is not None and any(not handle.is_removed for handle in self._handles)

    @property
    def registered(self) -> bool:
        """inferno's `registered`: whether `register()` placed hooks that `deregister()` has not removed, also when
        the module they were on was freed since (`is_registered` tells whether it is alive)."""
        return any(not handle.is_removed for handle in self._handles)

    @property
    def path(self) -> str | None:
        """The module path the hooks are listed under (set by `MonitorPool`)."""
        return self._path

    @path.setter
    def path(self, value: str | None) -> None:
        self._path = value
        for handle in self._handles:
            handle.path = value

    def register(self: MonitorT, module: nn.Module | None = None) -> MonitorT:
        """Place the hooks on `module` (or on the module last registered) and return `self`.

        Registering on the module already watched does nothing; a monitor registered to another module (still
        alive) refuses, as inferno's: `deregister()` it first to move it.

        Raises:
            RuntimeError: the monitor is registered to another module; or no module is given and none was
                registered before (or it was freed).
            TypeError: `module` is not an `nn.Module`, or is a TorchScript module.
        """
        target = module if module is not None else self.module
        if target is None:
            raise RuntimeError(
                f"{type(self).__name__}.register() needs a module: none was registered before (or it was freed); "
                "call register(module)"
            )
        check_hookable(target)
        if self.is_registered:
            if target is self.module:
                return self
            raise RuntimeError(
                f"{type(self).__name__}(Monitor) is already registered to a module so register() was ignored; "
                "call deregister() first to move it to another module"
            )
        self._check_target(target)
        self.deregister()
        self._observed = weakref.ref(target)
        self._handles.extend(self._attach(target))
        return self

    def deregister(self) -> None:
        """Remove the hooks; calling it again does nothing. The state is kept."""
        _remove_all(self._handles)

    def attach(self: MonitorT, module: nn.Module | None = None) -> MonitorT:
        """Same as `register(module)`."""
        return self.register(module)

    def detach(self) -> None:
        """Same as `deregister()`."""
        self.deregister()

    def remove(self) -> None:
        """Same as `deregister()`: every attachment's handle has `remove()`."""
        self.deregister()

    def __enter__(self: MonitorT) -> MonitorT:
        return self if self.is_registered else self.register()

    def __exit__(self, *exc_info: object) -> None:
        self.deregister()

    # ----------------------------------------------------------------- reading
    @property
    def counts(self) -> dict[str, int]:
        """How many observations were recorded, filtered out, gated by train/eval mode, or left incomplete."""
        return dict(self._counts)

    def peek(self) -> Any:
        """Return the reducer's current value."""
        return self.reducer.peek()

    def dump(self) -> Any:
        """Return everything the reducer kept."""
        return self.reducer.dump()

    def view(self, step: int) -> Any:
        """Return the reducer's value as of push `step`."""
        return self.reducer.view(step)

    def clear(self, **kwargs: Any) -> None:
        """Clear the monitor's state and re-initialize its reducer (`kwargs` go to `reducer.clear`)."""
        with self._lock:
            self._counts = dict.fromkeys(COUNTERS, 0)
            self._clear_pending()
        self.reducer.clear(**kwargs)

    # ----------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Return the counters and the reducer's state."""
        with self._lock:
            counts = dict(self._counts)
        return {"type": type(self).__name__, "counts": counts, "reducer": self.reducer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict()` returned, so that recording continues where it stopped; all or nothing.

        Raises:
            ValueError: `state` comes from another monitor type, or from another reducer type or config, or does
                not fit the format (the field is named); the monitor is left as it was.
        """
        self.check_state(state)
        self.reducer.load_state_dict(state["reducer"])
        with self._lock:
            self._counts = {name: state["counts"][name] for name in COUNTERS}

    def state_schema(self) -> Record:
        """The format of `state_dict()`; the reducer's part is checked by the reducer (`Reducer.check_state`)."""
        return Record(
            type=Const(type(self).__name__, "the monitor type that loads it"),
            counts=Record({name: Int(min=0) for name in COUNTERS}),
            reducer=Part("the reducer"),
        )

    def check_state(self, state: Any, at: str = "state") -> None:
        """Check `state` in full (the reducer's part included) against this monitor's format; change nothing.

        Raises:
            SchemaError: the first field that does not fit (a `ValueError`).
        """
        if not isinstance(state, dict):
            raise SchemaError("state", at, f"must be a {type(self).__name__}.state_dict(), got {found(state)}")
        if state.get("type") != type(self).__name__:
            raise SchemaError(
                "state",
                f"{at}.type",
                f"must come from a {type(self).__name__}, got one from {state.get('type')!r}; build the same "
                "monitor type before loading",
            )
        check(self.state_schema(), state, at=at)
        self.reducer.check_state(state["reducer"], at=f"{at}.reducer")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the state atomically to `path` (safetensors + JSON) and return the path."""
        return save_state(path, self.state_dict(), kind=self.state_kind)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore the state `save(path)` wrote into this monitor, in place (as `hookscope.load_state(path, m)`).

        A monitor cannot be rebuilt from a file (its selection and functions are code), so `load` restores into
        an existing one.
        """
        state = load_state(path, kind=self.state_kind)
        with from_file(path):
            self.load_state_dict(state)

    # ----------------------------------------------------------------- copies
    def __getstate__(self) -> dict[str, Any]:
        """A deep copy or a pickle is an unattached monitor with the same state (hooks stay with the original)."""
        with self._lock:
            state = {name: value for name, value in self.__dict__.items() if name not in _TRANSIENT}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._observed = None
        self._lifetime()
        self._detached_copy()
        self._clear_pending()

    # ----------------------------------------------------------------- for subclasses
    def _attach(self, module: nn.Module) -> list[HookHandle]:
        """Place inferno's `prehook` / `posthook` (subclasses place their own hooks)."""
        if self.prehook is None and self.posthook is None:
            raise TypeError(
                f"{type(self).__name__} places no hook: Monitor is the base of InputMonitor, OutputMonitor, "
                "StateMonitor ...; use one of them, or pass prehook= / posthook= (a hook or a method name)"
            )
        handles = []
        for kind, hook in (("forward_pre", self.prehook), ("forward", self.posthook)):
            if hook is not None:
                handles.append(self._hook(module, kind, self._weak(hook, gated=True)))
        return handles

    def _check_hook(self, argument: str, hook: str | Callable[..., Any] | None) -> str | Callable[..., Any] | None:
        if hook is None:
            return None
        if type(self)._attach is not Monitor._attach:
            raise TypeError(
                f"{argument} must be None for {type(self).__name__}, which places its own hooks, got {hook!r}; "
                f"{argument}= is for the base Monitor (inferno's), or a subclass that does not override _attach"
            )
        if isinstance(hook, str) and not callable(getattr(self, hook, None)):
            methods = [name for name in dir(type(self)) if callable(getattr(type(self), name, None))]
            close = closest_names(hook, methods, n=3)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"{argument} must name a method of {type(self).__name__}, got {hook!r}{hint}")
        return hook

    def _weak(self, hook: str | Callable[..., Any], gated: bool = False) -> Callable[..., Any]:
        """`hook` (a method name, a bound method of this monitor or another callable), holding the monitor weakly."""
        method = getattr(self, hook) if isinstance(hook, str) else hook
        return WeakCall(self, method, gated)

    def _check_target(self, module: nn.Module) -> None:
        """Raise early for a module this monitor cannot watch."""

    def _clear_pending(self) -> None:
        """Forget per-call state (values waiting for their forward to end)."""

    def _detached_copy(self) -> None:
        """Drop what ties a copy to the original's module (called on a deep copy or an unpickled monitor)."""

    def _default_filter(self, *observation: Any) -> bool:
        return any(True for _ in tensor_leaves(observation))

    def _default_map(self, *observation: Any) -> Any:
        return tuple(tensor for _, tensor in tensor_leaves(observation))

    def _hook(self, module: nn.Module, kind: str, callback: Callable[..., None], **options: Any) -> HookHandle:
        callback = callback if isinstance(callback, WeakCall) else self._weak(callback)
        return register_module_hook(
            module, kind, callback, owner=self, path=self._path, tags=(TAG,), prepend=self.prepend,
            errors=self.errors, **options,
        )  # fmt: skip

    def _admits(self, module: nn.Module) -> bool:
        """Whether a hook call on `module` should record: the watched module (not a copy) in an allowed mode."""
        if self._observed is None or module is not self._observed():
            return False
        if self.train_update if module.training else self.eval_update:
            return True
        self._bump("gated")
        return False

    def _bump(self, counter: str) -> None:
        with self._lock:
            self._counts[counter] += 1

    def _record(self, *observation: Any) -> None:
        """Filter, map and push one observation, counting what happened.

        Raises:
            UserHookError: the user's `filter_` or `map_` failed.
            RuntimeError: the reducer failed and the monitor is strict.
        """
        stage = "filter_"
        try:
            accepted = self._default_filter(*observation) if self.filter_ is None else self.filter_(*observation)
            if not accepted:
                self._bump("filtered")
                return
            stage = "map_"
            mapped = self._default_map(*observation) if self.map_ is None else self.map_(*observation)
            stage = "reducer"
            tensors = tuple(mapped) if isinstance(mapped, (tuple, list)) else (mapped,)
            with self._lock:
                self.reducer.push(*tensors)
                self._counts["recorded"] += 1
        except Exception as err:
            where = f"{stage} of {type(self).__name__} at {self._path or self._module_name()!r}"
            if stage != "reducer" and getattr(self, stage) is not None:  # the user's filter_ or map_
                raise UserHookError(f"{self!r} failed to record an observation: {err} (in the {where})") from err
            failure = RuntimeError(f"{self!r} failed to record an observation: {err} (in the {where})")
            failure.__cause__ = err
            self.errors.failed(failure, where)

    def _module_name(self) -> str:
        module = self.module
        return "" if module is None else type(module).__name__

    def __repr__(self) -> str:
        module = self.module
        target = "None" if module is None else type(module).__name__
        state = "registered" if self.is_registered else "not registered"
        return f"{type(self).__name__}(reducer={self.reducer!r}, module={target}, path={self._path!r}, {state})"


def _remove_all(handles: list[HookHandle]) -> None:
    """Remove `handles`, newest first, emptying the list (the finalizer and `deregister()` share it)."""
    while handles:
        handles.pop().remove()


class WeakCall:
    """A monitor's hook that holds the monitor weakly: a bound method of it is re-bound at each call, another
    callable is called as it is; once the monitor is freed the hook does nothing (and its finalizer removes it).

    With `gated`, the call is made only when the monitor admits it (its module, not a copy, in an allowed mode).
    """

    __slots__ = ("__qualname__", "function", "gated", "is_method", "monitor")

    def __init__(self, monitor: Monitor, method: Callable[..., Any], gated: bool = False) -> None:
        self.monitor = weakref.ref(monitor)
        self.is_method = getattr(method, "__self__", None) is monitor
        self.function: Callable[..., Any] = getattr(method, "__func__", method) if self.is_method else method
        self.gated = gated
        self.__qualname__ = getattr(method, "__qualname__", type(method).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        monitor = self.monitor()
        if monitor is None:
            return None
        if self.gated and args and isinstance(args[0], nn.Module) and not monitor._admits(args[0]):
            return None
        return self.function(monitor, *args, **kwargs) if self.is_method else self.function(*args, **kwargs)
