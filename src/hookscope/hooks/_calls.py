"""How every hook hookscope registers is called: one small wrapper object, and what happens when a hook fails.

`CalledHook` wraps each hook at registration (module, tensor, optimizer and global hooks alike). Two things follow
from that one place:

* Copies. `torch.save(model)`, `pickle.dumps(model)` and `copy.deepcopy(model)` leave the wrappers of a module's
  hooks out of the copy (`_copies.py`): the copy has no hook of hookscope's and loads without hookscope. Where a
  module class's own reduction keeps its hook dicts out of reach, a wrapper pickles as an `InertHook`, a hook that
  does nothing (the copy records nothing and writes nothing into the original's monitors).
* Failures. A hook of hookscope's own (watch, ActivationStats, monitors, weight monitors) is registered with a
  `HookErrors`: its failure is counted, warned about once (`HookFailureWarning`, pointing at the user's code) and
  the training goes on; with `strict=True` (or `HOOKSCOPE_STRICT=1` in the environment) it is re-raised instead.
  A hook the user passed in (no `HookErrors`) is re-raised as it is, with a note naming the hook and the module.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from .._check import checked
from .._errors import HookFailureWarning, UserHookError

__all__ = [
    "STRICT_ENV",
    "CalledHook",
    "HookErrors",
    "InertHook",
    "contained",
    "default_strict",
    "hook_name",
    "user_stacklevel",
]

Method = TypeVar("Method", bound=Callable[..., Any])

STRICT_ENV = "HOOKSCOPE_STRICT"
"""Environment variable: `1` makes `strict` default to `True` for every hookscope object (the test suite sets it)."""

_PACKAGE = str(Path(__file__).resolve().parents[1])
_TORCH = str(Path(torch.__file__).resolve().parent)
_INTERNAL = (_PACKAGE, _TORCH, str(Path(threading.__file__).resolve()))


def default_strict() -> bool:
    """Whether `strict=None` means strict: `HOOKSCOPE_STRICT` is `1`, `true`, `yes` or `on`."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def user_stacklevel() -> int:
    """The `stacklevel` of the first frame outside hookscope and torch, for `warnings.warn` called by the caller.

    A warning raised inside a hook then points at the user's line that ran the forward, backward or step.
    """
    frame = sys._getframe(1)  # the caller of this function, who calls warnings.warn
    level = 1
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_INTERNAL) and not filename.startswith("<"):
            return level
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return 2


def hook_name(hook: object) -> str:
    """A readable name for `hook`: its qualified name, or its type's."""
    name = getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None)
    return str(name) if name else type(hook).__name__


class HookErrors:
    """Where failures of one owner's observing hooks go: counted by reason, warned about once, or re-raised.

    Args:
        owner: Who placed the hooks, for the message (`"watch()"`, `"ActivationStats"` ...).
        strict: Re-raise failures instead of containing them; `None` reads `HOOKSCOPE_STRICT`.
        count: Called with `"error"` for each contained failure (the owner's `dropped` counter), if given; a bound
            method is held weakly, so the owner holding this object makes no reference cycle.
        counter: Where the owner shows the count, for the message.
    """

    @checked()
    def __init__(
        self,
        owner: str,
        strict: bool | None = None,
        count: Callable[[str], None] | None = None,
        counter: str = "dropped['error']",
    ) -> None:
        self.owner = owner
        self.strict = default_strict() if strict is None else strict
        self.failures = 0
        self.last: str | None = None
        self._count: Callable[[], Callable[[str], None] | None] | None = None
        if count is not None:
            self._count = weakref.WeakMethod(count) if hasattr(count, "__self__") else (lambda: count)
        self._counter = counter
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        """A copy or a pickle counts into the copy of the owner (the weak reference is rebuilt on load)."""
        state = dict(self.__dict__)
        state["_count"] = None if self._count is None else self._count()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        count = state.pop("_count")
        self.__dict__.update(state)
        self._count = None
        if count is not None:
            self._count = weakref.WeakMethod(count) if hasattr(count, "__self__") else (lambda: count)

    def failed(self, err: Exception, where: str) -> None:
        """Handle the failure `err` of a hook at `where`: re-raise under `strict`, else count and warn once.

        Raises:
            Exception: `err` itself (with a note saying where), when `strict` or when it is a `UserHookError` (the
                failure of a callable the user passed in).
        """
        if isinstance(err, UserHookError):
            raise err
        if self.strict:
            add_note(err, f"raised in {self.owner}'s {where} (strict=True)")
            raise err
        self.failures += 1
        self.last = f"{where}: {type(err).__name__}: {err}"
        count = None if self._count is None else self._count()
        if count is not None:
            count("error")
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"{self.owner}: its {where} failed with {type(err).__name__}: {err}. The training goes on; this and "
                f"any later failure of its hooks is skipped and counted in {self._counter}. Pass strict=True to "
                "raise instead.",
                HookFailureWarning,
                stacklevel=user_stacklevel(),
            )

    def guard(self, fn: Callable[..., Any], where: str) -> Callable[..., Any]:
        """`fn` with its failures handled here (for callbacks not registered through the registry)."""
        return CalledHook(fn, self, where)


def add_note(err: BaseException, note: str) -> None:
    """Add `note` to `err`'s traceback (Python 3.11+; nothing before)."""
    adder = getattr(err, "add_note", None)
    if callable(adder) and note not in getattr(err, "__notes__", ()):
        adder(note)


class InertHook:
    """What a hookscope hook becomes in a pickled or deep-copied model: a hook that does nothing."""

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __reduce__(self) -> tuple[type[InertHook], tuple[()]]:
        return (InertHook, ())


class Eager:
    """A hook that `torch.compile` runs as it is, before or after the compiled graph, never traced (bookkeeping
    that would break the graph or recompile it at every batch). `CalledHook` calls `fn` directly outside
    compilation (the disabled wrapper costs several microseconds a call) and the disabled `fn` while tracing."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.disabled = torch.compiler.disable(fn)  # type: ignore[no-untyped-call]
        functools.update_wrapper(self, fn)  # its name and signature are `fn`'s

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class CalledHook:
    """Call `fn`, handing its failures to `errors` (hookscope's own hooks) or naming `where` (a user's hook).

    Pickles and deep-copies as an `InertHook`.
    """

    __slots__ = ("__weakref__", "errors", "fn", "traced", "where")

    def __init__(self, fn: Callable[..., Any], errors: HookErrors | None, where: str) -> None:
        self.fn = fn.fn if isinstance(fn, Eager) else fn  # an `Eager` hook's function, called directly
        self.traced = fn.disabled if isinstance(fn, Eager) else fn  # what a trace by torch.compile calls
        self.errors = errors
        self.where = where

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # traced: no try block around the hook (graph breaks stay outside)
            return self.traced(*args, **kwargs)
        try:
            return self.fn(*args, **kwargs)
        except Exception as err:
            if self.errors is None:
                add_note(err, f"raised in {self.where}")
                raise
            self.errors.failed(err, self.where)
            return None

    def __reduce__(self) -> tuple[type[InertHook], tuple[()]]:
        return (InertHook, ())

    def __repr__(self) -> str:
        return f"CalledHook({hook_name(self.fn)}, {self.where!r})"


def contained(method: Method) -> Method:
    """Run `method` of an observing object (a watch, an ActivationStats) under its `_lock`, handing a failure to
    its `errors` (`HookErrors`): its events run inside the user's training, as its hooks do."""

    @functools.wraps(method)
    def run(self: Any, *args: Any) -> Any:
        try:
            with self._lock:
                return method(self, *args)
        except Exception as err:
            self.errors.failed(err, method.__name__)
            return None

    return run  # type: ignore[return-value]
