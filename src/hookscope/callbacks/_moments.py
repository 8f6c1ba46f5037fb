"""The statistics `ActivationStats` takes, on the device: large outputs at once, small ones batched per record.

A module output of `BATCH_BELOW` values or more is described when its hook sees it (a few full passes that reuse a
scratch buffer: sum, centred dot product, one compare); smaller outputs are copied and described together at
the end of the record (`RecordLayout`, `small_moments`): on small models the cost is the number of torch calls,
so every small output of a record shares one fixed set of calls. Histograms are one `bincount` of truncated bin
positions (3-6x faster than `histc` on the CPU), for all small outputs of a record at once. `hookscope.watch`
takes more statistics the same way (`hookscope/watch/_kernels.py`, `_batch.py`); this module stays apart so
that `callbacks` does not import `watch`, which builds on it.
"""

from __future__ import annotations

import torch

__all__ = [
    "BATCH_BELOW",
    "RecordLayout",
    "hist_counts",
    "hist_scale",
    "large_moments",
    "scale_from_bound",
    "scratch_like",
    "small_hist",
    "small_moments",
]

BATCH_BELOW = 1 << 15
"""Outputs with fewer values are described together at the end of the record; larger ones at once."""


def scratch_like(buffers: dict[torch.device, torch.Tensor], like: torch.Tensor) -> torch.Tensor | None:
    """A reused float32 buffer shaped like `like`, for CPU tensors (fresh allocations of a few MB cost page faults
    there; accelerators' caching allocators reuse memory already); `None` under `torch.compile` or above 16M
    values."""
    n = like.numel()
    if n > 1 << 24 or like.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    buffer = buffers.get(like.device)
    if buffer is None or buffer.numel() < n:
        buffer = buffers[like.device] = torch.empty(max(n, 1024), device=like.device)
    return buffer[:n].view(like.shape)


def large_moments(flat: torch.Tensor, near_zero: float, scratch: torch.Tensor | None) -> torch.Tensor:
    """(mean, population variance, count <= near_zero) of a flat float32 tensor as a (3,) float32: three passes
    and a dot product (two-pass variance, no cancellation; the count sums a 0/1 float buffer)."""
    n = flat.numel()
    mean = flat.sum() / n
    centred = flat - mean if scratch is None else torch.sub(flat, mean, out=scratch)
    variance = torch.dot(centred, centred) / n
    near = (flat <= near_zero).float() if scratch is None else torch.le(flat, near_zero, out=scratch)
    return torch.stack((mean, variance, near.sum()))


def hist_scale(
    values: torch.Tensor, bins: int, hist_range: tuple[float, float] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return 0-d float64 device tensors `(scale, shift)` mapping the range onto `[0, bins]` (no host sync);
    `hist_range=None`: `(-a, a)`, `a` the largest |value| of `values`."""
    if hist_range is not None:
        low, high = hist_range
        scale = bins / (high - low)
        full = torch.full((2,), -low * scale, dtype=torch.float64, device=values.device)
        full[0] = scale
        return full[0], full[1]
    smallest, largest = torch.aminmax(values)
    return scale_from_bound(torch.maximum(-smallest, largest).double(), bins)


def scale_from_bound(bound: torch.Tensor, bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(scale, shift)` of the symmetric range `(-bound, bound)`, elementwise (1 where `bound` is not finite and
    positive)."""
    bound = torch.where(torch.isfinite(bound) & (bound > 0), bound, torch.ones_like(bound))
    return bins / (2 * bound), torch.full_like(bound, bins / 2)


def hist_counts(
    flat: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, bins: int, scratch: torch.Tensor | None
) -> torch.Tensor:
    """Count the values of `flat` per bin ((bins,) float32): bin `floor(v * scale + shift)` clamped to the
    ends, as `histc` over `[0, bins]`; NaN goes to an extra bin that is dropped."""
    position = flat * scale if scratch is None else torch.mul(flat, scale.float(), out=scratch)
    position.add_(shift.float()).clamp_(0, bins - 0.5).nan_to_num_(nan=bins + 0.5)
    codes = position.to(torch.int16 if bins < 32767 else torch.int32)
    return torch.bincount(codes, minlength=bins + 1)[:bins].float()


class RecordLayout:
    """What does not change between records with the same small outputs (`parts`: (module, values) in hook
    order). Outputs of the same module form one group, merged by the reductions themselves."""

    def __init__(self, parts: tuple[tuple[int, int], ...], modules: int, bins: int, device: torch.device) -> None:
        ids: dict[int, int] = {}
        seg = [ids.setdefault(index, len(ids)) for index, _ in parts]
        self.modules = list(ids)
        count = [0] * len(ids)
        for g, (_, size) in zip(seg, parts, strict=True):
            count[g] += size
        self.sizes = count
        sizes = [size for _, size in parts]
        self.seg = _to(torch.repeat_interleave(torch.tensor(seg), torch.tensor(sizes)), device)
        self.count = _to(torch.tensor(count, dtype=torch.float64), device)
        self.targets = _to(torch.tensor([3 * j + k for j in self.modules for k in range(3)]), device)
        self.group_of = _to(torch.tensor(self.modules), device)
        self.columns = torch.empty(2, sum(sizes), dtype=torch.float64, device=device)
        self.hist: tuple[torch.Tensor, ...] | None = None  # per value (scale, offset, low, high): hist_positions
        self.bins, self.total_bins = bins, modules * bins

    def hist_positions(self, scale: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per value `(scale, offset, low, high)`: `clamp(v * scale + offset, low, high)` truncates to its slot
        in the flat (modules * bins) histogram of the record."""
        module_of = self.group_of.index_select(0, self.seg)
        low = module_of.double() * self.bins
        return scale.index_select(0, module_of), low + shift.index_select(0, module_of), low, low + (self.bins - 0.5)


def small_moments(values: torch.Tensor, layout: RecordLayout, near_zero: float) -> torch.Tensor:
    """(groups, 3) float64 (mean, population variance, count <= near_zero) of each group of flat float64 values."""
    seg, count, columns = layout.seg, layout.count, layout.columns
    mean = torch.zeros_like(count).index_add_(0, seg, values).div_(count)
    torch.sub(values, mean.index_select(0, seg), out=columns[0]).square_()
    torch.le(values, near_zero, out=columns[1])
    totals = torch.zeros(2, len(count), dtype=torch.float64, device=values.device).index_add_(1, seg, columns)
    return torch.stack((mean, totals[0] / count, totals[1]), dim=1)


def small_hist(values: torch.Tensor, layout: RecordLayout, positions: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """(modules * bins,) float32 histogram counts of the small values: every module's bins in one `bincount`."""
    scale, offset, low, high = positions
    total = layout.total_bins
    position = torch.addcmul(offset, values, scale).clamp_(low, high).nan_to_num_(nan=total + 0.5)
    return torch.bincount(position.to(torch.int32), minlength=total + 1)[:total].float()


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move a small index tensor built on the host to `device` (pinned and asynchronous on CUDA: no sync)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
