"""Refuse or warn where PyTorch would silently ignore hooks: scripted, traced and compiled modules."""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from .._check import POSITIVE, checked, shown
from .._errors import CompiledModelWarning

__all__ = ["check_hookable", "is_compiled", "warn_if_compiled"]


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
