"""Dead units: output units that were never active over a window of recent forwards."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .._check import FINITE, aliases, checked
from ..hooks import HookHandle, register_module_hook
from ..hooks._calls import HookErrors
from ..hooks._select import Selector, choose_modules
from ..hooks._tree import tensor_leaves

__all__ = ["DeadUnitDetector"]

_CHANNEL_FIRST = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class _UnitActivity:
    """Per layer: the index of the last forward in which each unit was active (-1: never), on the device."""

    def __init__(self) -> None:
        self.forwards = 0
        self.last_active: torch.Tensor | None = None

    def update(self, active: torch.Tensor) -> None:
        if self.last_active is None or self.last_active.shape != active.shape:
            self.last_active = torch.full(active.shape, -1, dtype=torch.int64, device=active.device)
            self.forwards = 0
        now = torch.full_like(self.last_active, self.forwards)
        self.last_active = torch.where(active, now, self.last_active)
        self.forwards += 1


class DeadUnitDetector:
    """Find output units that were never active (output > `threshold`) over the last `window` forwards.

    A forward hook on each chosen module reduces its output to one bool per unit on the device (no host sync)
    and keeps, per unit, the index of the last forward where it was active: memory O(units), whatever the
    window. Until `window` forwards have been seen, the window is all of them. Only forwards in training mode
    count unless `include_eval=True`.

    The unit axis is `unit_dim` when given; otherwise 1 for convolution and batch-norm outputs and for other
    outputs of 4 or 5 dimensions (images, volumes), else the last axis (Linear, transformer `(B, T, C)`).
    A failure inside its hooks never reaches the training: it is counted in `errors.failures` and warned once.

    Example:
        >>> import torch, torch.nn as nn
        >>> model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
        >>> with DeadUnitDetector(window=10).attach(model, "1") as detector:
        ...     _ = model(torch.randn(8, 3))
        >>> sorted(detector.dead_units())
        ['1']
    """

    @checked(threshold=FINITE)
    def __init__(
        self, window: int = 100, threshold: float = 0.0, *, unit_dim: int | None = None, include_eval: bool = False
    ) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        self.window = window
        self.threshold = float(threshold)
        self.unit_dim = unit_dim
        self.include_eval = include_eval
        self._activity: dict[str, _UnitActivity] = {}
        self._handles: list[HookHandle] = []
        self.errors = HookErrors("DeadUnitDetector", counter="detector.errors.failures")

    @aliases(layer_names="select")
    def attach(self, model: nn.Module, select: Selector = None) -> DeadUnitDetector:
        """Hook the modules `select` picks (default: those with parameters of their own); returns self.

        Raises:
            RuntimeError: the detector is already attached.
        """
        if self._handles:
            raise RuntimeError("DeadUnitDetector is already attached; call detach() before attaching again")
        for path, module in choose_modules(model, select, "select"):
            self._activity[path] = activity = self._activity.get(path, _UnitActivity())
            hook = self._hook(activity)
            tags = ("hookscope.weights", "dead_units")
            handle = register_module_hook(module, "forward", hook, owner=self, path=path, tags=tags, errors=self.errors)
            self._handles.append(handle)
        return self

    def _hook(self, activity: _UnitActivity) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not (module.training or self.include_eval):
                return
            tensor = next((t for _, t in tensor_leaves(output) if t.is_floating_point() and t.dim() > 0), None)
            if tensor is not None:
                activity.update(self._active_units(module, tensor.detach()))

        return hook

    def _active_units(self, module: nn.Module, output: torch.Tensor) -> torch.Tensor:
        dim = self.unit_dim
        if dim is None:
            dim = 1 if isinstance(module, _CHANNEL_FIRST) or output.dim() in (4, 5) else -1
        units = output.movedim(dim, -1)
        return (units.reshape(-1, units.shape[-1]) > self.threshold).any(dim=0)

    def detach(self) -> None:
        """Remove the hooks (what was recorded stays readable); calling it again does nothing."""
        while self._handles:
            self._handles.pop().remove()

    def remove(self) -> None:
        """Same as `detach()`: every attachment's handle has `remove()`."""
        self.detach()

    def __enter__(self) -> DeadUnitDetector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.detach()

    def forwards(self) -> dict[str, int]:
        """Path -> forwards recorded so far."""
        return {path: activity.forwards for path, activity in self._activity.items()}

    def dead_mask(self) -> dict[str, torch.Tensor]:
        """Path -> bool tensor (on the device), True for the units never active in the window."""
        masks = {}
        for path, activity in self._activity.items():
            if activity.last_active is not None:
                masks[path] = activity.last_active < max(0, activity.forwards - self.window)
        return masks

    def dead_units(self) -> dict[str, list[int]]:
        """Path -> indices of the units never active in the window (layers not seen yet are left out)."""
        return {path: torch.nonzero(mask).flatten().tolist() for path, mask in self.dead_mask().items()}

    def dead_fraction(self) -> dict[str, float]:
        """Path -> fraction of the units never active in the window."""
        return {path: float(mask.float().mean()) for path, mask in self.dead_mask().items()}

    def reset(self) -> None:
        """Forget every recorded forward."""
        for activity in self._activity.values():
            activity.forwards, activity.last_active = 0, None
