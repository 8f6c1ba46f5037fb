"""One registry for every hook hookscope places: handles, owners, tags and nested scopes.

The registry holds handles; a handle holds its target (module, tensor, optimizer) and its owner only through
weak references, so registering a hook never keeps a model alive. A handle whose target dies drops out of the
registry by itself.
"""

from __future__ import annotations

import collections
import contextvars
import itertools
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from .._torch import handle_key

__all__ = ["KINDS", "REGISTRY", "HookHandle", "HookRegistry", "Placement", "Scope", "scope"]

KINDS = frozenset(
    {
        "forward_pre",
        "forward",
        "backward_pre",
        "backward",
        "output_grad",
        "tensor",
        "post_accumulate_grad",
        "optimizer_step_pre",
        "optimizer_step_post",
        "global_forward_pre",
        "global_forward",
        "global_backward",
        "optimizer_global_step_pre",
        "optimizer_global_step_post",
    }
)

Remover = Callable[[], None]


class Placement(Protocol):
    """How a pausable hook comes off its target and goes back on (`HookHandle.pause` / `resume`)."""

    def lift(self) -> None:
        """Take the hook off its target (torch no longer calls it)."""

    def place(self) -> frozenset[tuple[int, int]]:
        """Put the hook back on its target; return the `torch_ids` of the torch handles now behind it."""


class HookHandle:
    """A hook that hookscope placed: `remove()` is idempotent and the handle is a context manager.

    A module or optimizer hook can also be paused: `pause()` takes it off its module or optimizer (torch no longer
    calls it, so a module whose hooks are all paused runs torch's fast path) while it stays registered and listed;
    `resume()` puts it back, after the hooks placed on that target meanwhile.

    Attributes:
        id: A number unique within the process.
        kind: One of `KINDS`.
        path: The dotted module path given at registration, or `None`.
        tags: Free-form labels for removal by tag.
        torch_ids: `(hooks dict id, hook id)` pairs of the torch handles behind it, to tell them from user hooks.
    """

    __slots__ = (
        "__weakref__",
        "_owner",
        "_paused",
        "_placement",
        "_registry",
        "_removers",
        "_target",
        "id",
        "kind",
        "path",
        "tags",
        "torch_ids",
    )

    def __init__(
        self,
        registry: HookRegistry,
        hook_id: int,
        kind: str,
        removers: list[Remover],
        *,
        target: object | None,
        owner: object | None,
        path: str | None,
        tags: frozenset[str],
        torch_ids: frozenset[tuple[int, int]],
        placement: Placement | None = None,
    ) -> None:
        self.id = hook_id
        self.kind = kind
        self.path = path
        self.tags = tags
        self.torch_ids = torch_ids
        self._removers: list[Remover] | None = removers
        self._placement = placement
        self._paused = False
        self._registry = registry
        self._owner = _weak_or_strong(owner)
        self._target = None if target is None else weakref.ref(target, registry._target_died(hook_id))

    @property
    def owner(self) -> object | None:
        """The object that placed the hook (`None` once it is garbage collected)."""
        owner = self._owner
        return owner() if isinstance(owner, weakref.ref) else owner

    @property
    def target(self) -> object | None:
        """The module, tensor or optimizer the hook is on (`None` for global hooks or once it died)."""
        return None if self._target is None else self._target()

    @property
    def is_removed(self) -> bool:
        """Whether `remove()` already ran."""
        return self._removers is None

    @property
    def is_paused(self) -> bool:
        """Whether the hook is off its target for now (`pause()`)."""
        return self._paused

    def pause(self) -> None:
        """Take the hook off its target until `resume()`; it stays registered. Nothing happens if it is already
        paused or removed.

        Raises:
            TypeError: the hook is neither a module hook nor an optimizer hook (only those can pause).
        """
        if self._placement is None:
            raise TypeError(
                f"only module and optimizer hooks can be paused, not a {self.kind!r} hook; remove() it instead"
            )
        if not self._paused and self._removers is not None:
            self._placement.lift()
            self._paused = True

    def resume(self) -> None:
        """Put a paused hook back on its target (after the hooks placed there meanwhile); nothing happens if it is
        not paused, or removed."""
        if self._paused and self._removers is not None and self._placement is not None:
            self.torch_ids = self._placement.place()
            self._paused = False

    def add_remover(self, remover: Remover) -> None:
        """Run `remover` too when the hook is removed (at once if it already was)."""
        if self._removers is None:
            remover()
        else:
            self._removers.append(remover)

    def remove(self) -> None:
        """Remove the hook; calling it again does nothing."""
        removers, self._removers = self._removers, None
        if removers is None:
            return
        for remover in removers:
            remover()
        self._registry._forget(self.id)

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "removed" if self.is_removed else "active"
        return f"HookHandle(id={self.id}, kind={self.kind!r}, path={self.path!r}, {state})"


class Scope:
    """Collects the handles registered while it is active; `remove()` removes exactly those, newest first."""

    def __init__(self) -> None:
        self.handles: list[HookHandle] = []

    def remove(self) -> None:
        """Remove every handle registered inside this scope."""
        while self.handles:
            self.handles.pop().remove()


_ACTIVE_SCOPES: contextvars.ContextVar[tuple[Scope, ...]] = contextvars.ContextVar("hookscope_scopes", default=())


@contextmanager
def scope() -> Iterator[Scope]:
    """Remove, on exit, exactly the hooks registered inside the block, also when the block raises.

    Hooks placed by the user or by an outer scope are left alone. Scopes nest.

    Example:
        >>> import torch.nn as nn, hookscope
        >>> model = nn.Linear(2, 2)
        >>> with hookscope.scope():
        ...     _ = hookscope.hook_output(model)
        ...     len(hookscope.list_hooks(model))
        1
        >>> len(hookscope.list_hooks(model))
        0
    """
    current = Scope()
    token = _ACTIVE_SCOPES.set((*_ACTIVE_SCOPES.get(), current))
    try:
        yield current
    finally:
        _ACTIVE_SCOPES.reset(token)
        current.remove()


class HookRegistry:
    """Every live hook hookscope placed, by id; thread-safe."""

    def __init__(self) -> None:
        self._handles: dict[int, HookHandle] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._forgotten: collections.deque[int] = collections.deque()

    def add(
        self,
        kind: str,
        removers: list[Remover],
        *,
        target: object | None = None,
        owner: object | None = None,
        path: str | None = None,
        tags: Iterable[str] = (),
        torch_handles: Iterable[Any] = (),
        placement: Placement | None = None,
    ) -> HookHandle:
        """Record a registration and return its handle; the innermost active scope takes it too (`placement`: how
        a pausable hook comes off and goes back)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
        torch_ids = frozenset(handle_key(h) for h in torch_handles)
        with self._lock:
            self._purge()
            handle = HookHandle(
                self, next(self._ids), kind, removers, target=target, owner=owner, path=path,
                tags=frozenset(tags), torch_ids=torch_ids, placement=placement,
            )  # fmt: skip
            self._handles[handle.id] = handle
        scopes = _ACTIVE_SCOPES.get()
        if scopes:
            scopes[-1].handles.append(handle)
        return handle

    def handles(self) -> list[HookHandle]:
        """The live handles, oldest first."""
        with self._lock:
            self._purge()
            return list(self._handles.values())

    def __len__(self) -> int:
        with self._lock:
            self._purge()
            return len(self._handles)

    def _forget(self, hook_id: int) -> None:
        # This runs from weakref callbacks, which the garbage collector may fire inside a locked section of this
        # same thread (any allocation there can trigger a collection): never block on the lock here, or that
        # thread deadlocks. Queue the id; whoever holds the lock next purges it.
        self._forgotten.append(hook_id)
        if self._lock.acquire(blocking=False):
            try:
                self._purge()
            finally:
                self._lock.release()

    def _purge(self) -> None:
        """Drop the queued ids; call with the lock held."""
        while self._forgotten:
            self._handles.pop(self._forgotten.popleft(), None)

    def _target_died(self, hook_id: int) -> Callable[[object], None]:
        registry = weakref.ref(self)

        def drop(_: object) -> None:
            alive = registry()
            if alive is not None:
                alive._forget(hook_id)

        return drop


def _weak_or_strong(owner: object | None) -> object | None:
    if owner is None or isinstance(owner, (str, int)):
        return owner
    try:
        return weakref.ref(owner)
    except TypeError:
        return owner


REGISTRY = HookRegistry()
