"""Refuse or warn where PyTorch would silently ignore hooks: scripted, traced and compiled modules."""

from __future__ import annotations

import warnings
import weakref

import torch
import torch.nn as nn

from .._check import POSITIVE, checked, shown
from .._errors import CompiledModelWarning
from .._torch import is_compile_wrapper, is_compiled_in_place

__all__ = ["check_hookable", "check_real_device", "is_compiled", "warn_if_compiled"]


@checked()
def is_compiled(module: nn.Module) -> bool:
    """Whether `module` is a `torch.compile` wrapper or was compiled in place with `module.compile()`."""
    return is_compile_wrapper(module) or is_compiled_in_place(module)


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


_WARNED: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # compiled models already warned about


@checked(stacklevel=POSITIVE)
def warn_if_compiled(model: nn.Module, stacklevel: int = 3) -> None:
    """Warn, once per compiled model, that hooks added after its first compiled call may not fire.

    torch.compile does not recompile when hooks are added (it does not guard on them): a graph compiled before
    runs without them until something else makes it recompile (a new input shape or dtype, a train/eval switch).
    """
    if is_compiled(model) and model not in _WARNED:
        _WARNED.add(model)
        warnings.warn(
            f"hooks are being attached to a torch.compile'd {type(model).__name__}: if it has already run, its "
            "compiled graph runs without them until torch.compile recompiles it (a new input shape or dtype, a "
            "train/eval switch), and until then the hooked modules record nothing (they are listed as "
            "unobserved). Attach hookscope before compiling the model, or call torch._dynamo.reset() after "
            "attaching to recompile with the hooks now.",
            CompiledModelWarning,
            stacklevel=stacklevel,
        )
