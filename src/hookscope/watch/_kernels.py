"""The statistics `watch()` takes of each tensor: a few fused torch calls per tensor, results left on the device.

Every function here is pure (no hooks, no state) and never reads a value back to the host, so all of a step's
statistics stay on the device until the buffers are flushed. This is the one place to optimize the per-tensor
cost (fusion, compilation) without touching the bookkeeping.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn

from ..hooks import tensor_leaves

__all__ = [
    "RAW_ACTIVATION",
    "activation_vector",
    "first_float",
    "grad_vector",
    "hist_counts",
    "hist_edges",
    "hist_scale",
    "identical_units",
    "merge_activation",
    "merge_grad",
    "param_grad_table",
    "saturation_bounds",
    "unit_activity",
    "unit_dims",
]

RAW_ACTIVATION = ("mean", "variance", "min", "max", "near_zero", "nonfinite", "saturated")
"""Columns of `activation_vector`: mean, population variance, min, max, count |x| <= near_zero, count of
non-finite values, count within 1% of the output range of a saturation bound (NaN for unbounded modules)."""

_NAN: dict[torch.device, torch.Tensor] = {}

_SATURATING: dict[type[nn.Module], tuple[float, float]] = {
    nn.Tanh: (-1.0, 1.0),
    nn.Softsign: (-1.0, 1.0),
    nn.Sigmoid: (0.0, 1.0),
    nn.Hardsigmoid: (0.0, 1.0),
}
_CHANNEL_FIRST = (nn.modules.conv._ConvNd, nn.modules.batchnorm._NormBase, nn.GroupNorm)


def first_float(output: Any) -> torch.Tensor | None:
    """Return the first floating-point tensor in `output` (a tensor or nested container), or `None`."""
    if type(output) is torch.Tensor:
        return output if output.is_floating_point() else None
    for _, tensor in tensor_leaves(output):
        if tensor.is_floating_point():
            return tensor
    return None


def activation_vector(xf: torch.Tensor, near_zero: float, bounds: tuple[float, float] | None) -> torch.Tensor:
    """Return the (7,) float32 statistics of `RAW_ACTIVATION` of the float32 tensor `xf` (non-empty).

    Only vectorized full-tensor kernels (sum, norm, min/max, in-place compare): the variance is two-pass
    (`||x - mean||^2 / n`, no cancellation), counts come from float 0/1 sums, never from bool reductions,
    which are several times slower on the CPU.
    """
    n = xf.numel()
    mean = xf.sum() / n
    spread = torch.linalg.vector_norm(xf - mean)
    smallest, largest = torch.aminmax(xf)
    magnitude = xf.abs()
    nonfinite = torch.count_nonzero(magnitude * 0)  # x * 0 is NaN exactly where x is not finite
    near = magnitude.le_(near_zero).sum()
    if bounds is None:
        saturated = _nan(xf.device)
    else:
        low, high = bounds  # saturated: within 1% of the output range from either bound
        saturated = (xf - (low + high) / 2).abs_().ge_(0.49 * (high - low)).sum()
    return torch.stack((mean, spread * spread / n, smallest, largest, near, nonfinite, saturated))


def _nan(device: torch.device) -> torch.Tensor:
    value = _NAN.get(device)
    if value is None:
        value = _NAN[device] = torch.tensor(math.nan, device=device)
    return value


def merge_activation(target: torch.Tensor, new: torch.Tensor, count: int, n: int) -> None:
    """Merge the `activation_vector` of `n` new values into `target`, which describes `count` values (Chan)."""
    total = count + n
    delta = new[0] - target[0]
    variance = (target[1] * count + new[1] * n + delta * delta * (count * n / total)) / total
    merged = torch.stack(
        (
            target[0] + delta * (n / total),
            variance,
            torch.minimum(target[2], new[2]),
            torch.maximum(target[3], new[3]),
            *(target[4:] + new[4:]).unbind(),
        )
    )
    target.copy_(merged)


def grad_vector(grad: torch.Tensor) -> torch.Tensor:
    """Return `(L2 norm, count of non-finite values)` of `grad` as a (2,) float32 tensor."""
    norm = torch.linalg.vector_norm(grad, dtype=torch.float32)
    return torch.stack((norm, torch.count_nonzero(grad * 0).float()))


def merge_grad(target: torch.Tensor, new: torch.Tensor) -> None:
    """Merge the `grad_vector` of more gradient values into `target` (norms combine as a root sum of squares)."""
    target.copy_(torch.stack((torch.hypot(target[0], new[0]), target[1] + new[1])))


def param_grad_table(grads: list[torch.Tensor]) -> torch.Tensor:
    """Return the (len(grads), 2) float32 `(L2 norm, count of non-finite values)` of each gradient.

    The norms come from one multi-tensor call; `x * 0` is 0 where `x` is finite and NaN elsewhere, so counting
    its non-zeros counts the non-finite values.
    """
    norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
    nonfinite = [torch.count_nonzero(zeroed) for zeroed in torch._foreach_mul(grads, 0.0)]
    return torch.stack((torch.stack(norms), torch.stack(nonfinite).float()), dim=1)


def hist_scale(
    xf: torch.Tensor, bins: int, hist_range: tuple[float, float] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return 0-d device tensors `(scale, shift)` that map the histogram range onto `[0, bins]`.

    With `hist_range=None` the range is `(-a, a)`, `a` the largest finite absolute value of `xf` (1 when there
    is none), computed on the device.
    """
    if hist_range is not None:
        low, high = hist_range
        scale = bins / (high - low)
        return torch.tensor(scale, device=xf.device), torch.tensor(-low * scale, device=xf.device)
    smallest, largest = torch.aminmax(xf)
    bound = torch.maximum(-smallest, largest)
    bound = torch.where(torch.isfinite(bound) & (bound > 0), bound, torch.ones_like(bound))
    return bins / (2 * bound), torch.tensor(bins / 2, device=xf.device)


def hist_counts(xf: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, bins: int) -> torch.Tensor:
    """Count the values of `xf` per bin (float32, (bins,)); out-of-range values go to the end bins, NaNs nowhere."""
    return torch.histc(torch.addcmul(shift, xf, scale).clamp_(0, bins), bins, 0, bins)


def hist_edges(scale: float, shift: float, bins: int) -> torch.Tensor:
    """Return the (bins + 1,) float32 edges of the histogram that `(scale, shift)` defines."""
    return ((torch.arange(bins + 1, dtype=torch.float64) - shift) / scale).float()


def saturation_bounds(module: nn.Module) -> tuple[float, float] | None:
    """Return the output bounds of a saturating activation module (tanh, sigmoid, hardtanh ...), else `None`."""
    if isinstance(module, nn.Hardtanh):  # ReLU6 too
        return float(module.min_val), float(module.max_val)
    for kind, bounds in _SATURATING.items():
        if isinstance(module, kind):
            return bounds
    return None


def unit_activity(xf: torch.Tensor, reduce: tuple[int, ...]) -> torch.Tensor:
    """Count, per unit, the values of `xf` that are > 0 (float32; NaN counts as not active)."""
    return xf.sign().clamp_(min=0).sum(dim=reduce)


def unit_dims(module: nn.Module, ndim: int) -> tuple[int, tuple[int, ...]] | None:
    """Return `(unit dim, dims to reduce)` of an output of `ndim` dims of `module`, or `None` below 2 dims.

    Units are channels (dim 1) for 4-D and 5-D outputs and for convolution and normalization layers, the last
    dim otherwise (features of a linear layer, of a transformer's (B, T, C) output).
    """
    if ndim < 2:
        return None
    unit = 1 if ndim >= 4 or isinstance(module, _CHANNEL_FIRST) else ndim - 1
    return unit, tuple(d for d in range(ndim) if d != unit)


def identical_units(module: nn.Module, tolerance: float = 1e-6) -> int | None:
    """Count the output units of `module` whose incoming weights (and bias) equal another unit's, within tolerance.

    Read from `weight` (one row per output unit; dim 1 for transposed convolutions) and `bias`. `None` for
    modules without a weight of 2 or more dims, and for embeddings (their rows are tokens, not units).
    """
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() < 2 or isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return None
    with torch.no_grad():
        rows = weight.detach()
        if isinstance(module, nn.modules.conv._ConvTransposeNd):
            rows = rows.transpose(0, 1)
        rows = rows.reshape(rows.shape[0], -1).to("cpu", torch.float64)
        bias = getattr(module, "bias", None)
        if isinstance(bias, torch.Tensor) and bias.shape == (rows.shape[0],):
            rows = torch.cat((rows, bias.detach().to("cpu", torch.float64)[:, None]), dim=1)
        keys = torch.round(rows / tolerance)
        _, inverse, counts = torch.unique(keys, dim=0, return_inverse=True, return_counts=True)
    return int((counts[inverse] > 1).sum())
