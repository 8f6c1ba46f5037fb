"""Tell the outermost `optimizer.step()` from nested ones.

torch wraps `type(optimizer).step` with its step-hook caller; an optimizer subclass whose `step` calls
`super().step()` therefore runs the hooks twice per step, once per level (the second time around the parent's
update). Hooks that count steps or copy state must act only at the outermost level. Looking at the call stack
(rather than keeping a depth counter) stays right when a step raises between the pre and post hooks.
"""

from __future__ import annotations

import sys

import torch

__all__ = ["is_nested_step"]

_WRAPPER_CODE = torch.optim.Optimizer.profile_hook_step(lambda *args, **kwargs: None).__code__


def is_nested_step(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the step hook being run belongs to a `step` called inside another `step` of `optimizer`."""
    frame = sys._getframe(1)
    levels = 0
    while frame is not None:
        if frame.f_code is _WRAPPER_CODE and frame.f_locals.get("self") is optimizer:
            levels += 1
            if levels > 1:
                return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
