"""Unit activity: how often each output unit (channel, feature) of a layer is active (> 0).

Units are the channels (dim 1) of 4-D and 5-D outputs and of convolution and normalization layers, the last dim
otherwise (the features of a linear layer, of a transformer's (B, T, C) output). A value is active when it is
finite and > 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ._describe import Described

__all__ = ["active", "unit_counts", "unit_dims"]

_CHANNEL_FIRST = (nn.modules.conv._ConvNd, nn.modules.batchnorm._NormBase, nn.GroupNorm)


def unit_dims(module: nn.Module | None, ndim: int) -> tuple[int, tuple[int, ...]] | None:
    """Return `(unit dim, dims to reduce)` of an output of `ndim` dims of `module`, or `None` below 2 dims."""
    if ndim < 2:
        return None
    unit = 1 if ndim >= 4 or isinstance(module, _CHANNEL_FIRST) else ndim - 1
    return unit, tuple(d for d in range(ndim) if d != unit)


def active(values: torch.Tensor) -> torch.Tensor:
    """1.0 where a value is active (finite and > 0; NaN never is), else 0.0, in `values`' float dtype."""
    return (values > 0).to(values.dtype if values.is_floating_point() else torch.float64) * torch.isfinite(values)


def unit_counts(described: Described, shape: tuple[int, ...], unit: int) -> torch.Tensor:
    """The (shape[unit],) float64 number of active values of each unit of the tensor `described` describes
    (estimated from its sample when it was sampled: each sampled value stands for numel / sample size)."""
    units = shape[unit]
    values = described.values
    if described.index is None:
        reduce = tuple(d for d in range(len(shape)) if d != unit)
        return active(values.view(shape)).sum(dim=reduce).double()
    inner = math.prod(shape[unit + 1 :])
    ids = torch.div(described.index, inner, rounding_mode="floor").remainder_(units)
    weight = math.prod(shape) / values.numel()
    return torch.bincount(ids, weights=active(values).double() * weight, minlength=units)
