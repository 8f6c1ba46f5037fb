"""Copies of small tensors built on the host (index tensors, layouts, constants) to the device they serve.

On CUDA a copy from pageable host memory waits for the device to finish its queue (a sync); `to_device` pins the
tensor and copies it asynchronously instead (the caching host allocator keeps the pinned memory until the copy is
done), so hookscope's hooks never wait for the model's kernels. Elsewhere it is `tensor.to(device)`.
"""

from __future__ import annotations

import torch

__all__ = ["to_device"]


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` (on the CPU) on `device`, without a host-device sync."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
