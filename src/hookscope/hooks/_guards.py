"""Refuse or warn where PyTorch would silently ignore hooks: scripted, traced and compiled modules."""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from .._check import POSITIVE, checked, shown
from .._errors import CompiledModelWarning

__all__ = ["check_hookable", "check_real_device", "is_compiled", "warn_if_compiled"]


@checked()
def is_compiled(module: nn.Module) -> bool:
    """Whether `module` is a `torch.compile` wrapper or was compiled in place with `module.compile()`."""
    return type(module).__name__ == "OptimizedModule" or getattr(module, "_compiled_call_impl", None) is not None


def check_hookable(module: object, argument: str = "module") -> None:
    """Raise for objects hooks cannot work on; warn for compiled modules.

    Raises:
        TypeError: `module` is not an `nn.Module`, or is a TorchScript (scripted or traced) module.
    """
    if isinstance(module, torch.jit.ScriptModule):
        raise TypeError(
            f"{argument} is a TorchScript module ({type(module).__name__}): hooks are unsupported on "
            "ScriptModule / traced graphs and would record nothing. Attach hookscope to the eager nn.Module "
            "before torch.jit.script/trace, or use torch.compile, which keeps hooks placed before compiling."
        )
    if not isinstance(module, nn.Module):
        raise TypeError(f"{argument} must be a torch.nn.Module, got {shown(module)}")


def check_real_device(module: nn.Module, argument: str = "module") -> None:
    """Refuse a module whose parameters or buffers are on the `meta` device (shapes only, no values to observe).

    Raises:
        ValueError: a parameter or buffer of `module` is a meta tensor.
    """
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.is_meta:
            raise ValueError(
                f"{argument} must hold real tensors, got {name!r} on the meta device (a model built under "
                "torch.device('meta') has shapes but no values): materialize it first, e.g. "
                "model.to_empty(device='cpu') and initialize or load its weights, then attach hookscope"
            )


@checked(stacklevel=POSITIVE)
def warn_if_compiled(model: nn.Module, stacklevel: int = 3) -> None:
    """Warn that torch.compile ignores hooks added after its first call on `model`."""
    if is_compiled(model):
        warnings.warn(
            f"hooks are being attached to a torch.compile'd {type(model).__name__}: if it has already run, "
            "torch.compile ignores hooks added after its first call and they will record nothing. Attach "
            "hookscope to the model before compiling it (or call torch._dynamo.reset() to force a recompile).",
            CompiledModelWarning,
            stacklevel=stacklevel,
        )
