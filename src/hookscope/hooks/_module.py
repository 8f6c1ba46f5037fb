"""Module hooks (forward-pre, forward, backward-pre, backward) and global module hooks, through the registry."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch.nn as nn
import torch.nn.modules.module as module_globals

from .._check import check_callable, checked, one_of
from .._torch import handle_key
from ._calls import CalledHook, HookErrors, hook_name
from ._copies import forget_copies, strip_copies
from ._guards import check_hookable, warn_if_compiled
from ._registry import REGISTRY, HookHandle

__all__ = ["MODULE_KINDS", "register_global_module_hook", "register_module_hook"]

MODULE_KINDS = ("forward_pre", "forward", "backward_pre", "backward")
_ARGUMENTS = {"forward_pre": 2, "forward": 3, "backward_pre": 2, "backward": 3}  # what torch calls hooks with
_GLOBAL_KINDS = {
    "forward_pre": module_globals.register_module_forward_pre_hook,
    "forward": module_globals.register_module_forward_hook,
    "backward": module_globals.register_module_full_backward_hook,
}


@checked(kind=one_of(MODULE_KINDS))
def register_module_hook(
    module: nn.Module,
    kind: str,
    hook: Callable[..., Any],
    *,
    owner: object | None = None,
    path: str | None = None,
    tags: Iterable[str] = (),
    prepend: bool = False,
    with_kwargs: bool = False,
    always_call: bool = False,
    errors: HookErrors | None = None,
) -> HookHandle:
    """Register `hook` on `module` and record it in the registry.

    Call contracts, as torch's: `forward_pre`: `hook(module, args) -> None or new args`; `forward`:
    `hook(module, args, output) -> None or new output`; `backward_pre`: `hook(module, grad_output) -> None or new
    grad_output`; `backward`: `hook(module, grad_input, grad_output) -> None or new grad_input` (full backward
    hooks; the deprecated `register_backward_hook` is never used). With `with_kwargs=True` forward hooks also
    receive the keyword arguments.

    The hook is wrapped (`hookscope.hooks._calls.CalledHook`), and a pickled, saved or deep-copied module leaves
    it behind (`hookscope.hooks._copies`): the copy has no hook of hookscope's. A failure of `hook` is re-raised
    with a note naming it and the module; given `errors` (hookscope's own observing hooks), it is handed to
    `errors` instead, which counts it and goes on unless strict.

    Raises:
        ValueError: `kind` is not one of `MODULE_KINDS`.
        TypeError: `module` is not an `nn.Module`, or is a TorchScript module.
    """
    check_hookable(module)
    arguments = _ARGUMENTS[kind] + (1 if with_kwargs and kind.startswith("forward") else 0)
    check_callable("hook", hook, arguments, f"for {kind!r} hooks{' with kwargs' if with_kwargs else ''}")
    warn_if_compiled(module)
    hook = CalledHook(hook, errors, f"{kind} hook {hook_name(hook)} on {path or type(module).__name__}")
    placement = _ModulePlacement(module, kind, hook, prepend, with_kwargs, always_call)
    placement.place()
    reference = weakref.ref(module)

    def remove() -> None:
        placement.lift()
        alive = reference()
        if alive is not None:
            forget_copies(alive)

    return REGISTRY.add(
        kind, [remove], target=module, owner=owner, path=path, tags=tags, torch_handles=[placement.handle],
        placement=placement,
    )  # fmt: skip


class _ModulePlacement:
    """One module hook's registration with torch: `place()` registers it (again), `lift()` removes it. A copy or
    a pickle of the module leaves the hook behind (`strip_copies`, renewed at each placing)."""

    __slots__ = ("always_call", "handle", "hook", "kind", "module", "prepend", "with_kwargs")

    def __init__(
        self, module: nn.Module, kind: str, hook: CalledHook, prepend: bool, with_kwargs: bool, always_call: bool
    ) -> None:
        self.module = weakref.ref(module)
        self.kind, self.hook = kind, hook
        self.prepend, self.with_kwargs, self.always_call = prepend, with_kwargs, always_call
        self.handle: Any = None

    def place(self) -> frozenset[tuple[int, int]]:
        module, kind, hook = self.module(), self.kind, self.hook
        if module is None:
            return frozenset()
        if kind == "forward_pre":
            handle = module.register_forward_pre_hook(hook, prepend=self.prepend, with_kwargs=self.with_kwargs)
        elif kind == "forward":
            handle = module.register_forward_hook(
                hook, prepend=self.prepend, with_kwargs=self.with_kwargs, always_call=self.always_call
            )
        elif kind == "backward_pre":
            handle = module.register_full_backward_pre_hook(hook, prepend=self.prepend)
        elif kind == "backward":
            handle = module.register_full_backward_hook(hook, prepend=self.prepend)
        else:
            raise ValueError(f"kind must be one of {MODULE_KINDS}, got {kind!r}")
        self.handle = handle
        strip_copies(module)
        return frozenset({handle_key(handle)})

    def lift(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.remove()


@checked(kind=one_of(_GLOBAL_KINDS))
def register_global_module_hook(
    kind: str,
    hook: Callable[..., Any],
    *,
    owner: object | None = None,
    tags: Iterable[str] = (),
    always_call: bool = False,
    errors: HookErrors | None = None,
) -> HookHandle:
    """Register `hook` for every module in the process (torch's global module hooks).

    Call contracts as in `register_module_hook`; `kind` is `"forward_pre"`, `"forward"` or `"backward"`;
    `always_call` (forward hooks) calls it also when the forward raises.

    Raises:
        ValueError: `kind` is not a global kind.
    """
    register = _GLOBAL_KINDS[kind]
    check_callable("hook", hook, _ARGUMENTS[kind], f"for {kind!r} hooks")
    wrapped = CalledHook(hook, errors, f"global {kind} hook {hook_name(hook)}")
    if always_call and kind == "forward":
        handle = module_globals.register_module_forward_hook(wrapped, always_call=True)
    else:
        handle = register(wrapped)
    return REGISTRY.add(f"global_{kind}", [handle.remove], owner=owner, tags=tags, torch_handles=[handle])
