"""`watch()`'s default selection: which modules it observes, and which modules' parameters it records."""

from __future__ import annotations

import torch.nn as nn

from .._check import checked
from ..hooks import named_modules
from ..hooks._select import select_modules

__all__ = ["ACTIVATION_TYPES", "default_selection", "default_selector"]

ACTIVATION_TYPES: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.RReLU, nn.ELU, nn.CELU, nn.SELU, nn.GELU, nn.SiLU, nn.Mish, nn.Hardswish,
    nn.Tanh, nn.Sigmoid, nn.Hardtanh, nn.Hardsigmoid, nn.Softsign,
)  # fmt: skip
"""Activation modules `watch()` observes by default besides the modules with parameters (dead units, saturation)."""


@checked()
def default_selector(path: str, module: nn.Module) -> bool:
    """`watch()`'s default: modules with parameters of their own, and leaf activation modules.

    Activation modules are those of `ACTIVATION_TYPES` and, for libraries with their own (Hugging Face's
    `GELUActivation` ...), leaf modules whose class name ends with `Activation`; a container such as torchvision's
    `Conv2dNormActivation` is not one (its convolution, norm and activation are selected themselves). With the
    default selection `watch()` also leaves out `nn.MultiheadAttention.out_proj`, whose weight its parent uses
    without calling it (it would never be observed); its parameters' gradients and update ratios are recorded.
    """
    if isinstance(module, ACTIVATION_TYPES):
        return True
    if type(module).__name__.endswith("Activation") and next(module.children(), None) is None:
        return True
    return next(iter(module.parameters(recurse=False)), None) is not None


def default_selection(model: nn.Module) -> tuple[list[tuple[str, nn.Module]], list[tuple[str, nn.Module]]]:
    """`(modules to observe, modules whose parameters to record)` of the default selection, in model order."""
    owners = select_modules(model, default_selector)
    never_called = {id(m.out_proj) for _, m in named_modules(model) if isinstance(m, nn.MultiheadAttention)}
    return [(path, m) for path, m in owners if id(m) not in never_called], owners
