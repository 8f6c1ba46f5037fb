"""Steps under a `torch.amp.GradScaler`: gradient norms without the loss scale, skipped steps as steps.

Under mixed precision the loss is multiplied by the scaler's scale before `backward`, so every output gradient
is that many times too large; `scaler.step` divides the parameter gradients back (`unscale_`) before the
optimizer sees them, but output gradients are seen by the hooks during `backward`, scaled. `GradScalerSteps`
reads the scale used by a backward (a device tensor: no host sync) so that `watch` divides the output-gradient
norms by it, and learns from the scaler, at the next training batch, whether its last `update()` followed an
optimizer step or a skipped one (non-finite gradients), without patching the scaler: `update()` replaces the
scaler's per-optimizer state, which is checked by identity. Both are private to `GradScaler` and read through
`hookscope._torch` (`scaler_scale`, `scaler_states`), which checks them on a tiny scaler first (the scale is the
tensor, and `update()` does replace the state): when torch changes either, one warning says so, norms stay scaled,
no step is counted as skipped, and `meta["grad_scaler"]` says so.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .._torch import scaler_scale, scaler_states

__all__ = ["GradScalerSteps", "check_scaler"]


def check_scaler(scaler: Any) -> torch.amp.GradScaler:
    """Return `scaler` if it is a `torch.amp.GradScaler`.

    Raises:
        TypeError: `scaler` is something else.
    """
    if not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(
            f"scaler must be the torch.amp.GradScaler that scales this model's loss, or None, got "
            f"{type(scaler).__name__}"
        )
    return scaler


class GradScalerSteps:
    """What `watch` reads from the loss scaler: the scale of each backward, and whether an update skipped a step.

    Args:
        scaler: The `torch.amp.GradScaler` of the training loop (kept by weak reference).
    """

    def __init__(self, scaler: torch.amp.GradScaler) -> None:
        self._ref = weakref.ref(scaler)
        self._states = scaler_states(scaler)
        self.readable = self._states is not None
        self.stepped = False  # the watched optimizer stepped since the scaler's last update

    def factor(self) -> torch.Tensor | None:
        """`1 / scale` of the scale the last backward used (a new 0-d device tensor), `None` when unscaled.

        Call it when a backward ends: the scaler changes its scale in place at `update()`.
        """
        scaler = self._ref()
        scale = None if scaler is None else scaler_scale(scaler)
        if scaler is None or scale is None or not scaler.is_enabled():
            return None
        return torch.pow(scale.detach(), -1.0)

    def updated(self) -> bool:
        """Whether `scaler.update()` ran since the last call (it replaces the scaler's per-optimizer state)."""
        states = scaler_states(self._ref())
        if states is None or states is self._states:
            return False
        self._states = states
        return True
