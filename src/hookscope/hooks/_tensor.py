"""Tensor gradient hooks and parameter post-accumulate-grad hooks, through the registry."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from .._check import check_callable, checked, shown
from ._calls import CalledHook, HookErrors, hook_name
from ._registry import REGISTRY, HookHandle

__all__ = ["register_post_accumulate_grad_hook", "register_tensor_hook"]


@checked()
def register_tensor_hook(
    tensor: torch.Tensor,
    hook: Callable[[torch.Tensor], torch.Tensor | None],
    *,
    owner: object | None = None,
    path: str | None = None,
    tags: Iterable[str] = (),
    errors: HookErrors | None = None,
) -> HookHandle:
    """Register `hook(grad) -> None or new grad` on `tensor`'s gradient (failures as in `register_module_hook`).

    Raises:
        TypeError: `tensor` is not a tensor.
        ValueError: `tensor` does not require grad.
    """
    _check_tensor(tensor, "tensor")
    check_callable("hook", hook, 1, "hook(grad) -> None or new grad")
    hook = CalledHook(hook, errors, f"tensor hook {hook_name(hook)} on {path or 'a tensor'}")
    handle = tensor.register_hook(hook)  # type: ignore[no-untyped-call]
    return REGISTRY.add(
        "tensor", [handle.remove], target=tensor, owner=owner, path=path, tags=tags, torch_handles=[handle]
    )


@checked()
def register_post_accumulate_grad_hook(
    parameter: torch.Tensor,
    hook: Callable[[torch.Tensor], None],
    *,
    owner: object | None = None,
    path: str | None = None,
    tags: Iterable[str] = (),
    errors: HookErrors | None = None,
) -> HookHandle:
    """Register `hook(parameter) -> None`, called once `parameter.grad` is fully accumulated for a backward.

    Unlike `parameter.register_hook`, it sees the gradient after accumulation (a parameter used twice is seen
    once) and it fires under FSDP2, where parameters are DTensors. Failures as in `register_module_hook`.

    Raises:
        TypeError: `parameter` is not a tensor.
        ValueError: `parameter` is not a leaf that requires grad.
    """
    _check_tensor(parameter, "parameter")
    if not parameter.is_leaf:
        raise ValueError(f"parameter must be a leaf tensor (a parameter), got a non-leaf {shown(parameter)}")
    check_callable("hook", hook, 1, "hook(parameter) -> None")
    hook = CalledHook(hook, errors, f"post-accumulate-grad hook {hook_name(hook)} on {path or 'a parameter'}")
    handle = parameter.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]
    return REGISTRY.add(
        "post_accumulate_grad", [handle.remove], target=parameter, owner=owner, path=path, tags=tags,
        torch_handles=[handle],
    )  # fmt: skip


def _check_tensor(tensor: torch.Tensor, argument: str) -> None:
    if not tensor.requires_grad:
        raise ValueError(
            f"{argument} must require grad to have gradient hooks, got {shown(tensor)}; call .requires_grad_() first"
        )
