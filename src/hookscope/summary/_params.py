"""What a module's parameters are: stored and effective counts (pruning masks), lazy ones, kernel size, groups.

`torch.nn.utils.prune` keeps the dense tensor as the parameter `<name>_orig` and a 0/1 buffer `<name>_mask`; the
*stored* count is the parameter's size and the *effective* count the non-zero entries of its mask. A lazy module
(`nn.LazyLinear` never run) holds `UninitializedParameter`s, whose size is unknown: they count 0 here and are
flagged instead (torch's `numel()` raises on them). Everything reads shapes and masks only, never values.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.nn.parameter import is_lazy

__all__ = ["ParamInfo", "count_bytes", "count_params", "effective_counts", "groups", "kernel_size", "own_params"]

_ORIG, _MASK = "_orig", "_mask"


@dataclass(frozen=True)
class ParamInfo:
    """One parameter held directly by a module (a row of `param_rows=True`).

    Attributes:
        name: Its name in the module; a pruned parameter shows the name it is used under (`weight`, not
            `weight_orig`).
        shape: Its shape; `None` while it is an uninitialized lazy parameter.
        numel: Elements stored (0 while uninitialized).
        effective: Elements left once its pruning mask is applied (its mask's non-zero count); `numel` if unpruned.
        trainable: Whether it requires grad.
        is_pruned: Whether a `torch.nn.utils.prune` mask applies to it.
        is_lazy: Whether it is an uninitialized lazy parameter.
    """

    name: str
    shape: torch.Size | None
    numel: int
    effective: int
    trainable: bool
    is_pruned: bool
    is_lazy: bool

    def to_dict(self) -> dict[str, Any]:
        """Return the parameter as JSON-ready values."""
        shape = None if self.shape is None else list(self.shape)
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "shape": shape}


def count_params(tensors: Iterable[torch.Tensor]) -> int:
    """Return the elements of `tensors`, uninitialized lazy ones counting 0."""
    return sum(0 if is_lazy(t) else t.numel() for t in tensors)


def count_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Return the bytes of `tensors` (from shapes and dtypes), uninitialized lazy ones counting 0."""
    return sum(0 if is_lazy(t) else t.numel() * t.element_size() for t in tensors)


def _mask_of(module: nn.Module, name: str) -> torch.Tensor | None:
    if not name.endswith(_ORIG):
        return None
    mask = dict(module.named_buffers(recurse=False)).get(name[: -len(_ORIG)] + _MASK)
    return mask if isinstance(mask, torch.Tensor) and not is_lazy(mask) else None


def _nonzero(mask: torch.Tensor, numel: int) -> int:
    if mask.is_meta:  # no values to count: the stored count is all that is known
        return numel
    return int(torch.count_nonzero(mask))  # one sync per pruned parameter, at summary time only


def own_params(module: nn.Module) -> tuple[ParamInfo, ...]:
    """Describe the parameters `module` holds directly (not those of its submodules), in registration order."""
    infos = []
    for name, parameter in module.named_parameters(recurse=False):
        lazy = is_lazy(parameter)
        numel = 0 if lazy else parameter.numel()
        mask = None if lazy else _mask_of(module, name)
        infos.append(
            ParamInfo(
                name=name[: -len(_ORIG)] if mask is not None else name,
                shape=None if lazy else parameter.shape,
                numel=numel,
                effective=numel if mask is None else _nonzero(mask, numel),
                trainable=parameter.requires_grad,
                is_pruned=mask is not None,
                is_lazy=lazy,
            )
        )
    return tuple(infos)


def effective_counts(modules: Iterable[nn.Module]) -> dict[int, int]:
    """Map `id(parameter)` to its effective count, for the parameters held by `modules`."""
    counts: dict[int, int] = {}
    for module in modules:
        for info, parameter in zip(own_params(module), module.parameters(recurse=False), strict=True):
            counts.setdefault(id(parameter), info.effective)
    return counts


def kernel_size(module: nn.Module) -> tuple[int, ...] | None:
    """Return the module's `kernel_size` as a tuple (convolutions, pooling), or `None` if it has none."""
    value = getattr(module, "kernel_size", None)
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
        return tuple(value)
    return None


def groups(module: nn.Module) -> int | None:
    """Return the module's `groups` (convolutions) or `num_groups` (GroupNorm), or `None` if it has neither."""
    for attribute in ("groups", "num_groups"):
        value = getattr(module, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
