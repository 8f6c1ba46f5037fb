"""Interventions as data: frozen dataclasses that say what to do with a site's value, and where inside it.

Every intervention edits a region of the value: the whole tensor, or the `positions` along `seq_dim` and/or the
`heads` (`n_heads` contiguous chunks of the last dimension, as in the input of an attention's output projection).
The region is chosen with torch's own indexing rules: an int position or head drops that dimension (as `x[:, 3]`),
a list or a slice keeps it. A tensor an intervention carries (a vector, a value, a mean, a direction) must
broadcast to the region. The value is never changed in place: the edit is a clone plus an indexed write, so
gradients flow through every intervention as through the same hand-written hook.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

import torch

from .._check import shown

__all__ = [
    "INTERVENTIONS",
    "Add",
    "Clamp",
    "Heads",
    "Intervention",
    "Mean",
    "Positions",
    "Project",
    "Replace",
    "Scale",
    "Zero",
]

Positions: TypeAlias = int | Sequence[int] | slice | None
Heads: TypeAlias = int | Sequence[int] | None


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class Intervention:
    """What to do with a site's value (a subclass says what) and where: `positions`, `heads` of `n_heads`.

    Args:
        positions: Where along `seq_dim`: an int, a list of ints or a slice; `None` for every position.
        heads: Which of the `n_heads` contiguous chunks of the last dimension: an int or a list; `None` for all.
        n_heads: How many heads the last dimension holds (required with `heads`).
        seq_dim: The dimension `positions` index (1: `[batch, seq, ...]`).
    """

    positions: Positions = None
    heads: Heads = None
    n_heads: int | None = None
    seq_dim: int = 1

    tensors: ClassVar[tuple[str, ...]] = ()
    """The fields that hold tensors (saved as tensors by `steer.save`)."""

    def __post_init__(self) -> None:
        _check_positions(self.positions)
        _check_heads(self.heads, self.n_heads)
        if isinstance(self.seq_dim, bool) or not isinstance(self.seq_dim, int):
            raise TypeError(f"seq_dim must be an int, got {shown(self.seq_dim)}")
        if self.seq_dim < 1:
            raise ValueError(f"seq_dim must be an int >= 1 (dim 0 is the batch), got {self.seq_dim!r}")
        for name in self.tensors:
            if not isinstance(getattr(self, name), torch.Tensor):
                raise TypeError(
                    f"{name} must be a torch.Tensor, got {shown(getattr(self, name))}; "
                    f"e.g. {type(self).__name__}({name}=torch.tensor([...]))"
                )

    def apply(self, value: torch.Tensor, site: str = "") -> torch.Tensor:
        """Return `value` with the region edited (a new tensor; `value` is untouched).

        Shape:
            value: `[batch, seq, ..., features]` (`seq` at `seq_dim`); the result has the same shape.

        Raises:
            ValueError: the region does not fit `value` (the message names `site`, the shape and the fix).
        """
        where = f"site {site!r}" if site else "the site"
        viewed = self._split_heads(value, where)
        if self.positions is None:
            edited = self._edit_heads(viewed, where)
        else:
            index = self._position_index(viewed, where)
            edited = viewed.clone()
            edited[index] = self._edit_heads(viewed[index], where)
        return edited.flatten(-2) if self.heads is not None else edited

    def check_width(self, width: int, site: str = "") -> None:
        """Check what can be checked from the site's last dimension alone, before any forward.

        Raises:
            ValueError: `n_heads` does not divide `width`, or a tensor's last dimension fits neither the width nor
                a head's width.
        """
        where = f"site {site!r}" if site else "the site"
        self._split_heads(torch.empty(1, width, device="meta"), where)
        last = width // int(self.n_heads or 1) if self.heads is not None else width
        for name in self.tensors:
            tensor = getattr(self, name)
            if tensor.dim() and tensor.shape[-1] not in (1, last):
                raise ValueError(
                    f"{type(self).__name__}.{name} of shape {tuple(tensor.shape)} does not fit {where}: its last "
                    f"dimension must be {last} (the site's width{' per head' if self.heads is not None else ''}), "
                    f"got {tensor.shape[-1]}"
                )

    def _edit(self, region: torch.Tensor, where: str) -> torch.Tensor:
        raise NotImplementedError

    def _split_heads(self, value: torch.Tensor, where: str) -> torch.Tensor:
        if self.heads is None:
            return value
        n_heads = int(self.n_heads or 1)
        if value.dim() < 2 or value.shape[-1] % n_heads:
            raise ValueError(
                f"{type(self).__name__} at {where} needs a last dimension divisible by n_heads={n_heads}, got a "
                f"value of shape {tuple(value.shape)}: heads are n_heads contiguous chunks of the last dimension, "
                "as in the input of an attention's output projection (record or intervene there with at='input')"
            )
        heads = [self.heads] if isinstance(self.heads, int) else list(self.heads)
        if any(not -n_heads <= head < n_heads for head in heads):
            raise ValueError(f"heads must be in [0, {n_heads}) at {where}, got {self.heads!r}")
        return value.view(*value.shape[:-1], n_heads, value.shape[-1] // n_heads)

    def _position_index(self, value: torch.Tensor, where: str) -> tuple[Any, ...]:
        last = value.dim() - (2 if self.heads is not None else 1)
        if self.seq_dim >= last:
            raise ValueError(
                f"{type(self).__name__}(positions=...) at {where} indexes dim {self.seq_dim}, but the value of shape "
                f"{tuple(value.shape)} has no sequence dimension there: pass seq_dim=, or positions=None"
            )
        size = value.shape[self.seq_dim]
        positions = self.positions
        items = [positions] if isinstance(positions, int) else [] if isinstance(positions, slice) else positions
        if any(not -size <= int(p) < size for p in items or ()):
            raise ValueError(
                f"positions must be in [-{size}, {size}) at {where} (a value of shape {tuple(value.shape)}), "
                f"got {positions!r}"
            )
        chosen = positions if isinstance(positions, (int, slice)) else list(items or ())
        return (*([slice(None)] * self.seq_dim), chosen)

    def _edit_heads(self, region: torch.Tensor, where: str) -> torch.Tensor:
        if self.heads is None:
            return self._checked_edit(region, where)
        index = (..., self.heads if isinstance(self.heads, int) else list(self.heads), slice(None))
        edited = region.clone()
        edited[index] = self._checked_edit(region[index], where)
        return edited

    def _checked_edit(self, region: torch.Tensor, where: str) -> torch.Tensor:
        for name in self.tensors:
            tensor = getattr(self, name)
            fits = tensor.dim() <= region.dim() and all(
                size in (1, wanted)
                for size, wanted in zip(reversed(tensor.shape), reversed(region.shape), strict=False)
            )
            if not fits:
                raise ValueError(
                    f"{type(self).__name__}.{name} of shape {tuple(tensor.shape)} does not fit {where}: the region "
                    f"it edits has shape {tuple(region.shape)} (after positions={self.positions!r}, "
                    f"heads={self.heads!r}); give a tensor that broadcasts to it, e.g. of shape "
                    f"{tuple(region.shape[-1:])}"
                )
        return self._edit(region, where)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = []
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if item.default is not dataclasses.MISSING and _same(value, item.default):
                continue
            if isinstance(value, torch.Tensor):
                shown.append(f"{item.name}=<tensor {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}>")
            else:
                shown.append(f"{item.name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return bool(a == b)


def _check_positions(positions: Positions) -> None:
    if positions is None or isinstance(positions, slice):
        return
    items = [positions] if isinstance(positions, int) else positions
    if (
        not isinstance(items, Sequence)
        or isinstance(items, str)
        or not items
        or any(isinstance(p, bool) or not isinstance(p, int) for p in items)
    ):
        raise TypeError(f"positions must be None, an int, a non-empty list of ints or a slice, got {shown(positions)}")


def _check_heads(heads: Heads, n_heads: int | None) -> None:
    if n_heads is not None and (isinstance(n_heads, bool) or not isinstance(n_heads, int)):
        raise TypeError(f"n_heads must be a positive int or None, got {shown(n_heads)}")
    if n_heads is not None and n_heads < 1:
        raise ValueError(f"n_heads must be a positive int, got {n_heads!r}")
    if heads is None:
        return
    items = [heads] if isinstance(heads, int) else heads
    if (
        not isinstance(items, Sequence)
        or isinstance(items, str)
        or not items
        or any(isinstance(h, bool) or not isinstance(h, int) for h in items)
    ):
        raise TypeError(f"heads must be None, an int or a non-empty list of ints, got {shown(heads)}")
    if n_heads is None:
        raise ValueError(f"heads={heads!r} needs n_heads= (how many heads the last dimension holds), got None")
    if any(not -n_heads <= h < n_heads for h in items):
        raise ValueError(f"heads must be in [0, {n_heads}) for n_heads={n_heads}, got {heads!r}")


def _check_number(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number{' or None' if allow_none else ''}, got {shown(value)}")


@dataclass(frozen=True, eq=False, repr=False)
class Zero(Intervention):
    """Set the region to zero (zero ablation)."""

    def _edit(self, region: torch.Tensor, where: str) -> torch.Tensor:
        return torch.zeros_like(region)


@dataclass(frozen=True, eq=False, repr=False)
class Scale(Intervention):
    """Multiply the region by `factor`."""

    factor: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_number("factor", self.factor)

    def _edit(self, region: torch.Tensor, where: str) -> torch.Tensor:
        return region * self.factor


@dataclass(frozen=True, eq=False, repr=False)
class Add(Intervention):
    """Add `scale * vector` to the region (a steering vector); `vector` broadcasts to the region."""

    vector: torch.Tensor
    scale: float = 1.0
    tensors: ClassVar[tuple[str, ...]] = ("vector",)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_number("scale", self.scale)

    def _edit(self, region: torch.Tensor, where: str) -> torch.Tensor:
        return region + self.scale * self.vector.to(region)


@dataclass(frozen=True, eq=False, repr=False)
class Replace(Intervention):
    """Replace the region by `value` (broadcast to it); no gradient reaches what it replaced."""

    value: torch.Tensor
    tensors: ClassVar[tuple[str, ...]] = ("value",)

    def _edit(self, region: torch.Tensor, where: str) -> torch.Tensor:
        return self.value.to(region).expand(region.shape).clone()


@dataclass(frozen=True, eq=False, repr=False)
class Mean(Intervention):
    """Replace the region by a given `mean` (mean ablation; `mean` broadcasts to the region, e.g. `[features]`)."""

    mean: torch.Tensor
    tensors: ClassVar[tuple[str, ...]] = ("mean",)

    def _edit(self, region: torch.Tensor, where: str) -> torch.Tensor:
        return self.mean.to(region).expand(region.shape).clone()


@dataclass(frozen=True, eq=False, repr=False)
class Clamp(Intervention):
    """Clamp the region to `[min, max]` (either may be `None`, not both)."""

    min: float | None = None
    max: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_number("min", self.min, allow_none=True)
        _check_number("max", self.max, allow_none=True)
        if self.min is None and self.max is None:
            raise ValueError("Clamp needs min= or max= (or both), got neither")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"Clamp min must be <= max, got min={self.min!r}, max={self.max!r}")

    def _edit(self, region: torch.Tensor, where: str) -> torch.Tensor:
        return region.clamp(self.min, self.max)


@dataclass(frozen=True, eq=False, repr=False)
class Project(Intervention):
    """Remove the component along `direction` (`keep="off"`) or keep only that component (`keep="on"`).

    `direction` is a vector of the region's last dimension (normalized when applied).
    """

    direction: torch.Tensor
    keep: str = "off"
    tensors: ClassVar[tuple[str, ...]] = ("direction",)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.keep, str):
            raise TypeError(f"keep must be 'off' or 'on', got {shown(self.keep)}")
        if self.keep not in ("off", "on"):
            raise ValueError(f"keep must be 'off' or 'on', got {self.keep!r}")
        if self.direction.dim() != 1:
            raise ValueError(f"direction must be a 1-dim vector, got shape {tuple(self.direction.shape)}")

    def _edit(self, region: torch.Tensor, where: str) -> torch.Tensor:
        unit = self.direction.to(region)
        unit = unit / unit.norm()
        along: torch.Tensor = (region @ unit).unsqueeze(-1) * unit
        return along if self.keep == "on" else region - along


INTERVENTIONS: dict[str, type[Intervention]] = {
    cls.__name__: cls for cls in (Zero, Scale, Add, Replace, Mean, Clamp, Project)
}
"""Every intervention type by name (what `steer.save` writes and `steer.load` accepts)."""
