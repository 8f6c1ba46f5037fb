"""What `watch()` reads from modules besides statistics: a saturating activation's bounds, and identical units in a
layer's weights. Every statistic is the engine's (`hookscope.stats`).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .._check import FINITE, NON_NEGATIVE, checked
from ..stats._dtensor import is_dtensor

__all__ = ["identical_units", "saturation_bounds"]

_SATURATING: dict[type[nn.Module], tuple[float, float]] = {
    nn.Tanh: (-1.0, 1.0),
    nn.Softsign: (-1.0, 1.0),
    nn.Sigmoid: (0.0, 1.0),
    nn.Hardsigmoid: (0.0, 1.0),
}


def saturation_bounds(module: nn.Module) -> tuple[float, float] | None:
    """Return the output bounds of a saturating activation module (tanh, sigmoid, hardtanh ...), else `None`."""
    if isinstance(module, nn.Hardtanh):  # ReLU6 too
        return float(module.min_val), float(module.max_val)
    for kind, bounds in _SATURATING.items():
        if isinstance(module, kind):
            return bounds
    return None


@checked(tolerance=(NON_NEGATIVE, FINITE))
def identical_units(module: nn.Module, tolerance: float = 1e-6) -> int | None:
    """Count the output units of `module` whose incoming weights (and bias) equal another unit's, within tolerance.

    Read from `weight` (one row per output unit; dim 1 for transposed convolutions) and `bias`. `None` for
    modules without a weight of 2 or more dims, for embeddings (their rows are tokens, not units) and for sharded
    (DTensor) weights.
    """
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() < 2 or isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return None
    if is_dtensor(weight):  # a shard (FSDP2): comparing units would need every rank's rows
        return None
    with torch.no_grad():
        rows = weight.detach()
        if isinstance(module, (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)):
            rows = rows.transpose(0, 1)
        rows = rows.reshape(rows.shape[0], -1).to("cpu", torch.float64)
        bias = getattr(module, "bias", None)
        if isinstance(bias, torch.Tensor) and bias.shape == (rows.shape[0],):
            rows = torch.cat((rows, bias.detach().to("cpu", torch.float64)[:, None]), dim=1)
        keys = torch.round(rows / tolerance)
        _, inverse, counts = torch.unique(keys, dim=0, return_inverse=True, return_counts=True)
    return int((counts[inverse] > 1).sum())
