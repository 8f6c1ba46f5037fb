"""Weight constraints (MaxNorm, Clamp, UnitNorm, NonNeg) applied as a parametrization, after each optimizer step
or before each forward, each counting how often it had to correct a weight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .._check import FINITE, checked, hint_for

__all__ = ["Clamp", "Constraint", "MaxNorm", "NonNeg", "UnitNorm"]


class Constraint:
    """A projection of a weight onto a set: `project` is pure (and differentiable), `apply_` works in place.

    Subclasses define `project(weight) -> Tensor` and `violated(weight) -> 0-d bool tensor` (whether `project`
    would change the weight). Neither reads anything back to the host.
    """

    def project(self, weight: torch.Tensor) -> torch.Tensor:
        """Return the closest weight that satisfies the constraint (entries already inside are unchanged)."""
        raise NotImplementedError

    def violated(self, weight: torch.Tensor) -> torch.Tensor:
        """Return a 0-d bool tensor: whether `weight` needs a correction."""
        raise NotImplementedError

    def apply_(self, weight: torch.Tensor) -> torch.Tensor:
        """Project `weight` in place under `torch.no_grad()`; return whether it needed a correction (0-d bool).

        The in-place write bumps the tensor's version counter, so autograd refuses a backward through a graph
        that saved the old value instead of silently using the new one.
        """
        with torch.no_grad():
            needed = self.violated(weight)
            weight.copy_(self.project(weight))
        return needed

    def __call__(self, weight: torch.Tensor) -> torch.Tensor:
        return self.project(weight)


hint_for(Constraint, "one of MaxNorm, Clamp, UnitNorm, NonNeg, or a subclass of Constraint")


def _unit_norms(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """L2 norm of each unit (slice along `dim`), in float32 or wider, shaped to broadcast against `weight`."""
    if weight.dim() == 0:
        return weight.detach().abs().float().reshape(())
    others = [d for d in range(weight.dim()) if d != dim % weight.dim()]
    dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
    if not others:
        return weight.abs().to(dtype)
    norms: torch.Tensor = torch.linalg.vector_norm(weight, dim=others, keepdim=True, dtype=dtype)
    return norms


def _check_dim(dim: object) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int (the axis of output units), got {dim!r}")
    return dim


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


class MaxNorm(Constraint):
    """Rescale every unit whose weight has an L2 norm above `max_norm` down to `max_norm`, keeping its direction.

    A unit is a slice along `dim` (0: rows of the weight viewed as `(out_features, -1)`); units under the
    bound are left bit for bit as they are.
    """

    @checked()
    def __init__(self, max_norm: float = 3.0, dim: int = 0) -> None:
        self.max_norm = _positive("max_norm", max_norm)
        self.dim = _check_dim(dim)

    def project(self, weight: torch.Tensor) -> torch.Tensor:
        norms = _unit_norms(weight, self.dim)
        scale = torch.where(norms > self.max_norm, self.max_norm / norms, torch.ones_like(norms))
        return weight * scale.to(weight.dtype)

    def violated(self, weight: torch.Tensor) -> torch.Tensor:
        return (_unit_norms(weight.detach(), self.dim) > self.max_norm).any()

    def __repr__(self) -> str:
        return f"MaxNorm(max_norm={self.max_norm}, dim={self.dim})"


class UnitNorm(Constraint):
    """Rescale every unit (slice along `dim`) to an L2 norm of 1; units already within `tolerance` of 1, and
    all-zero units (which have no direction), are left as they are."""

    @checked()
    def __init__(self, dim: int = 0, tolerance: float = 1e-6) -> None:
        self.dim = _check_dim(dim)
        self.tolerance = _positive("tolerance", tolerance)

    def _off(self, norms: torch.Tensor) -> torch.Tensor:
        return ((norms - 1.0).abs() > self.tolerance) & (norms > 0)

    def project(self, weight: torch.Tensor) -> torch.Tensor:
        norms = _unit_norms(weight, self.dim)
        scale = torch.where(self._off(norms), 1.0 / norms.clamp_min(torch.finfo(norms.dtype).tiny), 1.0)
        return weight * scale.to(weight.dtype)

    def violated(self, weight: torch.Tensor) -> torch.Tensor:
        return self._off(_unit_norms(weight.detach(), self.dim)).any()

    def __repr__(self) -> str:
        return f"UnitNorm(dim={self.dim}, tolerance={self.tolerance})"


class Clamp(Constraint):
    """Clamp every entry into `[min, max]` (either bound may be `None`)."""

    @checked(min=FINITE, max=FINITE)
    def __init__(self, min: float | None = None, max: float | None = None) -> None:
        if min is None and max is None:
            raise ValueError("Clamp must get min or max (or both), got neither")
        for name, bound in (("min", min), ("max", max)):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))):
                raise TypeError(f"{name} must be a number or None, got {bound!r}")
        if min is not None and max is not None and min > max:
            raise ValueError(f"min must be <= max, got min={min!r}, max={max!r}")
        self.min = None if min is None else float(min)
        self.max = None if max is None else float(max)

    def project(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.clamp(min=self.min, max=self.max)

    def violated(self, weight: torch.Tensor) -> torch.Tensor:
        outside = torch.zeros((), dtype=torch.bool, device=weight.device)
        if self.min is not None:
            outside = outside | (weight.detach() < self.min).any()
        if self.max is not None:
            outside = outside | (weight.detach() > self.max).any()
        return outside

    def __repr__(self) -> str:
        return f"{type(self).__name__}(min={self.min}, max={self.max})"


class NonNeg(Clamp):
    """Set negative entries to zero."""

    def __init__(self) -> None:
        super().__init__(min=0.0)

    def __repr__(self) -> str:
        return "NonNeg()"


def check_constraint(constraint: object) -> Constraint:
    """Return `constraint` if it is a `Constraint`, else raise a `TypeError` naming the built-in ones."""
    if not isinstance(constraint, Constraint):
        names: Sequence[str] = ("MaxNorm", "Clamp", "UnitNorm", "NonNeg")
        raise TypeError(
            f"constraint must be a hookscope Constraint ({', '.join(names)}, or a subclass), "
            f"got {type(constraint).__name__}"
        )
    return constraint
