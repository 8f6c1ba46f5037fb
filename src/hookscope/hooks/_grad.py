"""Gradients of module outputs, observed with tensor hooks on the outputs instead of full backward hooks.

Full backward hooks fail when an in-place op follows the module (torch issue 61519) and cannot see tensors
nested in dicts or namedtuples (issue 87540). Here a forward hook finds every output tensor that requires grad
and registers one multi-grad hook on them, which fires once with all their gradients. A module called k times
in one forward gets k call indices (0 .. k-1), and each call is paired with its own gradient.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn as nn

from .._check import check_callable, checked
from .._errors import HookscopeWarning
from ._calls import CalledHook, HookErrors, hook_name
from ._module import register_module_hook
from ._registry import HookHandle
from ._tree import tensor_leaves

__all__ = ["OutputGradHook", "UnsupportedOutputWarning", "register_output_grad_hook"]

OutputGradHook = Callable[[nn.Module, tuple[torch.Tensor | None, ...], int], None]


class UnsupportedOutputWarning(HookscopeWarning):
    """A module's output holds no tensor that hookscope can reach, so its gradient cannot be observed."""


class _CallToken:
    """Lives as long as one call's autograd graph holds its gradient hook."""

    __slots__ = ("__weakref__",)


class _PendingCalls:
    """Calls whose gradient has not arrived yet; a call whose graph was freed unused drops out by itself."""

    def __init__(self) -> None:
        self.active = True
        self.warn = True
        self._pending: list[weakref.ref[_CallToken]] = []

    def start(self) -> tuple[_CallToken, int]:
        self._pending = [ref for ref in self._pending if ref() is not None]
        token = _CallToken()
        self._pending.append(weakref.ref(token))
        return token, len(self._pending) - 1

    def finish(self, token: _CallToken) -> None:
        self._pending = [ref for ref in self._pending if ref() is not token and ref() is not None]


@checked()
def register_output_grad_hook(
    module: nn.Module,
    hook: OutputGradHook,
    *,
    owner: object | None = None,
    path: str | None = None,
    tags: Iterable[str] = (),
    prepend: bool = False,
    errors: HookErrors | None = None,
) -> HookHandle:
    """Call `hook(module, grad_output, call_index) -> None` with d loss / d output of each call of `module`.

    `grad_output` holds one entry per output tensor that requires grad, in the order of
    `hookscope.hooks.tensor_leaves(output)` (`None` where that output received no gradient). Outputs that do not
    require grad (no-grad or eval passes, integer outputs) produce no call. Failures of `hook` (during backward)
    are handled as in `register_module_hook`, with `errors`.
    """
    check_callable("hook", hook, 3, "hook(module, grad_output, call_index) -> None")
    pending = _PendingCalls()
    where = f"output-gradient hook {hook_name(hook)} on {path or type(module).__name__}"
    forward_hook = _OutputGradForwardHook(CalledHook(hook, errors, where), pending)
    handle = register_module_hook(
        module, "forward", forward_hook, owner=owner, path=path, tags=tags, prepend=prepend, errors=errors
    )
    handle.kind = "output_grad"
    handle.add_remover(_deactivate(pending))
    return handle


class _OutputGradForwardHook:
    """The forward hook that arms one multi-grad hook per call (left out of copies of the module)."""

    def __init__(self, hook: OutputGradHook, pending: _PendingCalls) -> None:
        self.hook = hook
        self.pending = pending

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        tensors = [t for _, t in tensor_leaves(output)]
        leaves = [t for t in tensors if t.requires_grad]
        if not leaves or not self.pending.active:
            if not tensors and not isinstance(output, (type(None), str, int, float, bool)):
                self._warn_unsupported(module, output)
            return
        token, index = self.pending.start()
        # The autograd graph keeps this closure until it is freed: hold the module weakly so it never keeps it.
        module_ref, hook, pending = weakref.ref(module), self.hook, self.pending

        def on_grads(grads: Any) -> None:
            pending.finish(token)
            alive = module_ref()
            if pending.active and alive is not None:
                hook(alive, tuple(grads), index)

        torch.autograd.graph.register_multi_grad_hook(leaves, on_grads, mode="all")

    def _warn_unsupported(self, module: nn.Module, output: Any) -> None:
        if not self.pending.warn:
            return
        self.pending.warn = False
        warnings.warn(
            f"the output of {type(module).__name__} is a {type(output).__name__}, which holds no tensor in a tuple, "
            "list or dict: its gradient is unsupported and will not be observed; observe the module that produces "
            "its tensors instead",
            UnsupportedOutputWarning,
            stacklevel=3,
        )


def _deactivate(pending: _PendingCalls) -> Callable[[], None]:
    def remove() -> None:
        pending.active = False

    return remove
