"""DTensors (FSDP2 parameters and their gradients): the one test of what is one, and this rank's part of it.

Every consumer (watch's parameter reading, its weight inspection, `hookscope.distributed`) asks `is_dtensor`, an
`isinstance` test against torch's public `torch.distributed.tensor.DTensor`. That module is never imported here:
a DTensor cannot exist before its module was imported, so while it is absent nothing is one (and a run without
FSDP2 does not pay for the import).
"""

from __future__ import annotations

import sys

import torch

__all__ = ["is_dtensor", "is_sharded", "local_part"]


def is_dtensor(tensor: object) -> bool:
    """Whether `tensor` is a `torch.distributed.tensor.DTensor` (an FSDP2 parameter or gradient)."""
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None)
    return dtensor is not None and isinstance(tensor, dtensor)


def is_sharded(tensor: object) -> bool:
    """Whether `tensor` is a DTensor with a sharded placement (each rank holds a part of its values)."""
    return is_dtensor(tensor) and any(p.is_shard() for p in tensor.placements)  # type: ignore[attr-defined]


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (its local shard or replica); any other tensor as it is."""
    return tensor.to_local() if is_dtensor(tensor) else tensor  # type: ignore[attr-defined]
