"""The statistics `ActivationStats` takes, on the device: large outputs at once, small ones batched per record.

A module output of `BATCH_BELOW` values or more is described when its hook sees it (a few full passes that reuse a
scratch buffer: sum, centred dot product, one compare); smaller outputs are copied and described together at
the end of the record (`RecordLayout`, `small_moments`): on small models the cost is the number of torch calls,
so every small output of a record shares one fixed set of calls. Histograms are one `bincount` of truncated bin
positions (3-6x faster than `histc` on the CPU), for all small outputs of a record at once. `RecordWriter`
is the part of `ActivationStats` that keeps a record's pending outputs and writes them into the record's row.
`hookscope.watch` takes more statistics the same way (`hookscope/watch/_kernels.py`, `_batch.py`); this module
stays apart so that `callbacks` does not import `watch`, which builds on it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = [
    "BATCH_BELOW",
    "RecordLayout",
    "RecordWriter",
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


class RecordWriter:
    """The recording half of `ActivationStats`: pending outputs of the open record, written into its row when the
    record is settled (large outputs described at once, small ones together), histogram ranges on the device."""

    near_zero: float
    with_hist: bool
    hist_bins: int
    hist_range: tuple[float, float] | None
    capacity: int
    paths: list[str]
    _row: int
    _pending_row: int
    _counts: list[list[int]]
    _moments: torch.Tensor | None
    _hists: torch.Tensor | None
    _scales: list[tuple[torch.Tensor, torch.Tensor] | None]
    _scale_table: tuple[torch.Tensor, torch.Tensor] | None
    _cache: Any
    _small: list[tuple[int, torch.Tensor]]
    _large: list[tuple[int, int, torch.Tensor, torch.Tensor | None]]
    _traced: list[tuple[int, torch.Tensor]]
    _layouts: dict[tuple[tuple[int, int], ...], RecordLayout]
    _scratch: dict[torch.device, torch.Tensor]

    def _describe_large(self, index: int, flat: torch.Tensor) -> None:
        scratch = scratch_like(self._scratch, flat)
        moments = large_moments(flat, self.near_zero, scratch)
        hist = None
        if self.with_hist:
            scale, shift = self._scale_of(index, flat)
            hist = hist_counts(flat, scale, shift, self.hist_bins, scratch)
        self._large.append((index, flat.numel(), moments, hist))

    def _scale_of(self, index: int, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale, shift = self._tables(flat.device)
        if self._scales[index] is None:
            new_scale, new_shift = hist_scale(flat, self.hist_bins, self.hist_range)
            scale[index], shift[index] = new_scale, new_shift
            self._scales[index] = (scale[index], shift[index])
        return scale[index], shift[index]

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The histogram `(scale, shift)` of every module as (modules,) float64 device tensors."""
        tables = self._scale_table
        if tables is None or tables[0].device != device:
            modules = len(self.paths)
            scale = torch.ones(modules, dtype=torch.float64, device=device)
            shift = torch.zeros(modules, dtype=torch.float64, device=device)
            for j, value in enumerate(self._scales):
                if value is not None:
                    scale[j], shift[j] = value[0].to(device), value[1].to(device)
                    self._scales[j] = (scale[j], shift[j])
            tables = self._scale_table = (scale, shift)
            self._layouts.clear()
        return tables

    def _settle(self) -> None:
        """Write the pending outputs of the record into its row (small ones with a fixed number of calls)."""
        if self._traced and self._row >= 0:
            self._pending_row = self._row
        for index, tensor in self._traced:
            if tensor.numel() < BATCH_BELOW:
                self._small.append((index, tensor))
            else:
                self._describe_large(index, tensor.reshape(-1))
        self._traced = []
        if not (self._small or self._large) or self._pending_row < 0:
            return
        small, large, row = self._small, self._large, self._pending_row
        self._small, self._large, self._cache = [], [], None
        device = small[0][1].device if small else large[0][2].device
        moments, counts = self._buffer(row, device), self._counts[row]
        if small:
            self._settle_small(row, small, moments, counts)
        for index, n, values, hist in large:
            target = moments[row, index]
            if counts[index] == 0:
                target.copy_(values)
            else:
                _merge_moments(target, values, counts[index], n)
            counts[index] += n
            if hist is not None and self._hists is not None:
                self._hists[row, index].add_(hist)

    def _settle_small(
        self, row: int, small: list[tuple[int, torch.Tensor]], moments: torch.Tensor, counts: list[int]
    ) -> None:
        parts = tuple((index, tensor.numel()) for index, tensor in small)
        values = torch._C._nn.flatten_dense_tensors([tensor for _, tensor in small])  # float64 copies
        layout = self._layouts.get(parts)
        if layout is None:
            if len(self._layouts) >= 32:
                self._layouts.clear()
            layout = self._layouts[parts] = RecordLayout(parts, len(self.paths), self.hist_bins, values.device)
        table = small_moments(values, layout, self.near_zero)
        if any(counts[j] for j in layout.modules):  # described in part already (settled mid-batch): merge
            for g, j in enumerate(layout.modules):
                _merge_into(moments[row, j], table[g].float(), counts[j], layout.sizes[g])
        else:
            moments[row].view(-1).index_copy_(0, layout.targets, table.view(-1).float())
        for j, size in zip(layout.modules, layout.sizes, strict=True):
            counts[j] += size
        if self.with_hist and self._hists is not None:
            self._hists[row].view(-1).add_(small_hist(values, layout, self._hist_positions(layout, values)))

    def _hist_positions(self, layout: RecordLayout, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if layout.hist is None:
            scale, shift = self._tables(values.device)
            missing = [g for g, j in enumerate(layout.modules) if self._scales[j] is None]
            if missing:  # the range comes from this first record: all missing modules at once
                largest = torch.full((len(layout.modules),), math.nan, dtype=torch.float64, device=values.device)
                largest.scatter_reduce_(0, layout.seg, values.abs(), "amax", include_self=False)
                rows = torch.tensor(missing, device=values.device)
                targets = layout.group_of.index_select(0, rows)
                if self.hist_range is None:
                    new_scale, new_shift = scale_from_bound(largest.index_select(0, rows), self.hist_bins)
                else:
                    new_scale, new_shift = hist_scale(values, self.hist_bins, self.hist_range)
                scale.index_copy_(0, targets, new_scale.expand(len(missing)))
                shift.index_copy_(0, targets, new_shift.expand(len(missing)))
                for g in missing:
                    j = layout.modules[g]
                    self._scales[j] = (scale[j], shift[j])
            layout.hist = layout.hist_positions(scale, shift)
        return layout.hist

    def _buffer(self, row: int, device: torch.device) -> torch.Tensor:
        moments = self._moments
        if moments is not None and row < moments.shape[0]:
            return moments
        rows = min(self.capacity, max(64, 2 * (row + 1)))
        self._moments = _grow(moments, (rows, len(self.paths), 3), device)
        if self.with_hist:
            self._hists = _grow(self._hists, (rows, len(self.paths), self.hist_bins), device)
        return self._moments


def _merge_moments(target: torch.Tensor, new: torch.Tensor, count: int, n: int) -> None:
    """Merge (mean, population variance, near-zero count) of `n` new values into `target` of `count` (Chan)."""
    total = count + n
    delta = new[0] - target[0]
    variance = (target[1] * count + new[1] * n + delta * delta * (count * n / total)) / total
    target.copy_(torch.stack((target[0] + delta * (n / total), variance, target[2] + new[2])))


def _merge_into(target: torch.Tensor, new: torch.Tensor, count: int, n: int) -> None:
    if count == 0:
        target.copy_(new)
    else:
        _merge_moments(target, new, count, n)


def _grow(old: torch.Tensor | None, shape: tuple[int, int, int], device: torch.device) -> torch.Tensor:
    new = torch.zeros(shape, device=device if old is None else old.device)
    if old is not None:
        new[: old.shape[0]] = old
    return new
