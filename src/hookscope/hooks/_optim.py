"""Optimizer step pre/post hooks, per optimizer or global, through the registry."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .._check import check_callable, checked, one_of
from ._calls import CalledHook, HookErrors, hook_name
from ._registry import REGISTRY, HookHandle

__all__ = ["register_global_optimizer_hook", "register_optimizer_hook"]

_STEP_KINDS = ("step_pre", "step_post")
OptimizerHook = Callable[[torch.optim.Optimizer, tuple[Any, ...], dict[str, Any]], Any]


@checked(kind=one_of(_STEP_KINDS))
def register_optimizer_hook(
    optimizer: torch.optim.Optimizer,
    kind: str,
    hook: OptimizerHook,
    *,
    owner: object | None = None,
    tags: Iterable[str] = (),
    errors: HookErrors | None = None,
) -> HookHandle:
    """Register `hook(optimizer, args, kwargs) -> None` before (`"step_pre"`) or after (`"step_post"`) each step.

    Failures as in `hookscope.hooks.register_module_hook`.

    Raises:
        TypeError: `optimizer` is not a `torch.optim.Optimizer`.
        ValueError: `kind` is neither `"step_pre"` nor `"step_post"`.
    """
    check_callable("hook", hook, 3, "hook(optimizer, args, kwargs) -> None")
    hook = CalledHook(hook, errors, f"optimizer {kind} hook {hook_name(hook)} on {type(optimizer).__name__}")
    placement = _OptimizerPlacement(optimizer, kind, hook)
    placement.place()
    return REGISTRY.add(
        f"optimizer_{kind}", [placement.lift], target=optimizer, owner=owner, tags=tags, placement=placement
    )


class _OptimizerPlacement:
    """One optimizer hook's registration with torch: `place()` registers it (again, after the optimizer's hooks
    placed meanwhile), `lift()` removes it."""

    __slots__ = ("handle", "hook", "kind", "optimizer")

    def __init__(self, optimizer: torch.optim.Optimizer, kind: str, hook: CalledHook) -> None:
        self.optimizer = weakref.ref(optimizer)
        self.kind, self.hook = kind, hook
        self.handle: Any = None

    def place(self) -> frozenset[tuple[int, int]]:
        optimizer = self.optimizer()
        if optimizer is None:
            return frozenset()
        if self.kind == "step_pre":
            self.handle = optimizer.register_step_pre_hook(self.hook)
        else:
            self.handle = optimizer.register_step_post_hook(self.hook)
        return frozenset()

    def lift(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.remove()


@checked(kind=one_of(_STEP_KINDS))
def register_global_optimizer_hook(
    kind: str,
    hook: OptimizerHook,
    *,
    owner: object | None = None,
    tags: Iterable[str] = (),
    errors: HookErrors | None = None,
) -> HookHandle:
    """Register `hook(optimizer, args, kwargs) -> None` around the step of every optimizer in the process.

    Raises:
        ValueError: `kind` is neither `"step_pre"` nor `"step_post"`.
    """
    check_callable("hook", hook, 3, "hook(optimizer, args, kwargs) -> None")
    hook = CalledHook(hook, errors, f"global optimizer {kind} hook {hook_name(hook)}")
    if kind == "step_pre":
        handle = register_optimizer_step_pre_hook(hook)
    elif kind == "step_post":
        handle = register_optimizer_step_post_hook(hook)
    else:
        raise ValueError(f"kind must be 'step_pre' or 'step_post', got {kind!r}")
    return REGISTRY.add(f"optimizer_global_{kind}", [handle.remove], owner=owner, tags=tags)
