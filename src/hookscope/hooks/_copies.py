"""Copies of a hooked module leave hookscope's hooks behind: `torch.save`, `pickle`, `copy.deepcopy`, `copy.copy`.

A module that carries a hookscope hook gets, in its own `__dict__`, a `__reduce_ex__` (`CopyWithoutHooks`) that
pickle and `copy` look up on the instance before the class. It reduces the module as its class does, then takes
hookscope's entries (`CalledHook`s, and their ids in torch's `*_with_kwargs` / `*_always_called` side tables) out
of the copied state. So a model saved while hookscope watches it is the pickle of the same model saved without
hookscope: it names only the user's classes and torch's, loads with the weights-only `torch.load(f)` in a process
that never imported hookscope, and the copy carries no hook of ours, not even an inert one. The attribute goes
when the module's last hookscope hook is removed. The names of torch's hook tables are private torch attributes,
listed in `hookscope._torch`.

A parametrized module (`torch.nn.utils.parametrize`, the constraints' `"parametrize"` mode) is torch's own case:
torch refuses to pickle it, and its class deep-copies the `__dict__` itself, so such a deep copy keeps its hooks as
`InertHook`s (they do nothing).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import torch.nn as nn

from .._torch import MODULE_HOOK_SIDE_TABLES, MODULE_HOOK_TABLES
from ._calls import CalledHook

__all__ = ["CopyWithoutHooks", "forget_copies", "strip_copies"]

_ATTRIBUTE = "__reduce_ex__"


class CopyWithoutHooks:
    """`module.__reduce_ex__(protocol)`: the class's own reduction, with hookscope's hooks taken out of the state."""

    __slots__ = ("module",)

    def __init__(self, module: nn.Module) -> None:
        self.module = weakref.ref(module)  # the module's __dict__ holds this object: no cycle through it

    def __call__(self, protocol: int) -> Any:
        module = self.module()
        if module is None:  # cannot happen while the module's __dict__ holds this object
            raise RuntimeError("the module this reduction belongs to was freed")
        reduced = type(module).__reduce_ex__(module, protocol)  # the class's rule (a parametrized module refuses)
        if not isinstance(reduced, tuple) or len(reduced) < 3 or not isinstance(reduced[2], dict):
            return reduced  # a class with its own reduction: its hooks pickle as InertHook (CalledHook.__reduce__)
        return (*reduced[:2], without_hooks(reduced[2]), *reduced[3:])

    def __deepcopy__(self, memo: dict[int, Any]) -> CopyWithoutHooks | None:
        """Reached only when a class deep-copies its `__dict__` itself (torch's parametrized modules): bind the
        reduction to the replica, which that deep copy put in `memo` first."""
        module = self.module()
        replica = memo.get(id(module)) if module is not None else None
        return CopyWithoutHooks(replica) if isinstance(replica, nn.Module) else None

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(None), ())  # never reached: `without_hooks` drops it from the state it copies


def without_hooks(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of a module's state without this reduction and without hookscope's hooks (torch's tables copied)."""
    state = {name: value for name, value in state.items() if name != _ATTRIBUTE}
    dropped: dict[str, set[Any]] = {}
    for name in MODULE_HOOK_TABLES:
        table = state.get(name)
        if isinstance(table, dict):
            ours = {key for key, hook in table.items() if isinstance(hook, CalledHook)}
            dropped[name] = ours
            state[name] = OrderedDict((key, hook) for key, hook in table.items() if key not in ours)
    for name, owner in MODULE_HOOK_SIDE_TABLES.items():
        table = state.get(name)
        if isinstance(table, dict):
            state[name] = OrderedDict((key, flag) for key, flag in table.items() if key not in dropped.get(owner, ()))
    return state


def strip_copies(module: nn.Module) -> None:
    """Make copies of `module` leave hookscope's hooks behind (call after registering one on it)."""
    if not isinstance(module.__dict__.get(_ATTRIBUTE), CopyWithoutHooks):
        module.__dict__[_ATTRIBUTE] = CopyWithoutHooks(module)


def forget_copies(module: nn.Module) -> None:
    """Remove the reduction once `module` carries no hookscope hook (call after removing one)."""
    if not isinstance(module.__dict__.get(_ATTRIBUTE), CopyWithoutHooks):
        return
    for name in MODULE_HOOK_TABLES:
        if any(isinstance(hook, CalledHook) for hook in module.__dict__.get(name, {}).values()):
            return
    del module.__dict__[_ATTRIBUTE]
