"""The statistics `ActivationStats` takes, on the device: large outputs at once, small ones batched over records.

A module output of `BATCH_BELOW` values or more is described when its hook sees it (a few full passes that reuse a
scratch buffer: sum, centred dot product, one compare); smaller outputs are copied and described together, up to
`FLUSH_RECORDS` records at once (`RecordLayout`, `small_moments`): on small models the cost is the number of torch
calls, so every small output of many records shares one fixed set of calls. Histograms are one `bincount` of
truncated bin positions (3-6x faster than `histc` on the CPU), for all pending small outputs at once.
`RecordWriter` is the part of `ActivationStats` that keeps the pending outputs and writes them into their rows.
`hookscope.watch` takes more statistics the same way (`hookscope/watch/_kernels.py`, `_batch.py`); this module
stays apart so that `callbacks` does not import `watch`, which builds on it.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = [
    "BATCH_BELOW",
    "FLUSH_RECORDS",
    "FLUSH_VALUES",
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
"""Outputs with fewer values are described together, many records at once; larger ones at once."""
FLUSH_VALUES = 1 << 18
"""Pending small values (float64, 2 MiB) that make a record's end describe them."""
FLUSH_RECORDS = 64
"""Records of pending small outputs that make a record's end describe them."""


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
    """What does not change between flushes with the same pending small outputs (`parts`: (record relative to
    the first pending one, module, values), in hook order). Outputs of the same module in the same record form
    one group, merged by the reductions themselves."""

    def __init__(self, parts: tuple[tuple[int, int, int], ...], modules: int, bins: int, device: torch.device) -> None:
        ids: dict[tuple[int, int], int] = {}
        seg = [ids.setdefault((row, index), len(ids)) for row, index, _ in parts]
        self.groups = list(ids)  # (relative record, module)
        count = [0] * len(ids)
        for g, (_, _, size) in zip(seg, parts, strict=True):
            count[g] += size
        self.sizes = count
        self.span = max(row for row, _ in self.groups) + 1  # records covered
        sizes = [size for _, _, size in parts]
        self.seg = _to(torch.repeat_interleave(torch.tensor(seg), torch.tensor(sizes)), device)
        self.count = _to(torch.tensor(count, dtype=torch.float64), device)
        self.targets = _to(torch.tensor([(r * modules + j) * 3 + k for r, j in self.groups for k in range(3)]), device)
        self.group_of = _to(torch.tensor([j for _, j in self.groups]), device)
        self.slot_of = _to(
            torch.tensor([(r * modules + j) * bins for r, j in self.groups], dtype=torch.float64), device
        )
        self.columns = torch.empty(2, sum(sizes), dtype=torch.float64, device=device)
        self.hist: tuple[torch.Tensor, ...] | None = None  # per value (scale, offset, low, high): hist_positions
        self.bins, self.total_bins = bins, self.span * modules * bins

    def hist_positions(self, scale: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per value `(scale, offset, low, high)`: `clamp(v * scale + offset, low, high)` truncates to its slot
        in the flat (records * modules * bins) histograms of the flushed records."""
        module_of = self.group_of.index_select(0, self.seg)
        low = self.slot_of.index_select(0, self.seg)
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
    """The recording half of `ActivationStats`: pending outputs and their records' rows on the device.

    Large outputs are described in their hook and written into their row when the record closes. Small ones
    are copied and wait, many records at once, until `FLUSH_VALUES` values or `FLUSH_RECORDS` records are
    pending or the statistics are read (`_settle`): one fixed set of torch calls then describes them all, so a
    small model pays a few calls per record, not a few per module.
    """

    near_zero: float
    with_hist: bool
    hist_bins: int
    hist_range: tuple[float, float] | None
    capacity: int
    paths: list[str]
    _row: int
    _counts: list[list[int]]
    _moments: torch.Tensor | None
    _hists: torch.Tensor | None
    _scales: list[tuple[torch.Tensor, torch.Tensor] | None]
    _scale_table: tuple[torch.Tensor, torch.Tensor] | None
    _cache: Any
    _small: list[tuple[int, int, torch.Tensor]]  # (record, module, float64 copy)
    _small_values: int
    _large: list[tuple[int, int, int, torch.Tensor, torch.Tensor | None]]  # (record, module, n, moments, hist)
    _traced: list[tuple[int, torch.Tensor]]
    _layouts: dict[tuple[tuple[int, int, int], ...], RecordLayout]
    _scratch: dict[torch.device, torch.Tensor]

    def _keep_small(self, row: int, index: int, x: torch.Tensor) -> None:
        self._keep_owned(row, index, x.to(torch.float64, copy=True))  # a copy: in-place ops may follow

    def _keep_owned(self, row: int, index: int, values: torch.Tensor) -> None:
        """Keep a float64 copy of a small output of record `row` until the pending ones are described."""
        self._small.append((row, index, values))
        self._small_values += values.numel()

    def _describe_large(self, row: int, index: int, flat: torch.Tensor) -> None:
        scratch = scratch_like(self._scratch, flat)
        moments = large_moments(flat, self.near_zero, scratch)
        hist = None
        if self.with_hist:
            if self._scales[index] is None and any(j == index for _, j, _ in self._small):
                self._flush_small()  # the range comes from the module's first record
            scale, shift = self._scale_of(index, flat)
            hist = hist_counts(flat, scale, shift, self.hist_bins, scratch)
        self._large.append((row, index, flat.numel(), moments, hist))

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

    def _close(self) -> None:
        """The open record ends: take what traced hooks handed over, write the large outputs into their rows,
        and describe the pending small ones if enough are waiting."""
        row = self._row
        traced, self._traced = self._traced, []
        for index, tensor in traced if row >= 0 else ():
            if tensor.numel() < BATCH_BELOW:
                self._keep_owned(row, index, tensor)  # traced hooks copied it (float64)
            else:
                self._describe_large(row, index, tensor.reshape(-1))
        if self._large:
            self._write_large()
        small = self._small
        if small and (self._small_values >= FLUSH_VALUES or small[-1][0] - small[0][0] >= FLUSH_RECORDS - 1):
            self._flush_small()

    def _settle(self) -> None:
        """Write everything pending into the rows (before the statistics are read)."""
        self._close()
        self._flush_small()

    def _write_large(self) -> None:
        large, self._large, self._cache = self._large, [], None
        moments = self._buffer(max(entry[0] for entry in large), large[0][3].device)
        for row, index, n, values, hist in large:
            counts = self._counts[row]
            _merge_into(moments[row, index], values, counts[index], n)
            counts[index] += n
            if hist is not None and self._hists is not None:
                self._hists[row, index].add_(hist)

    def _flush_small(self) -> None:
        """Describe every pending small output with one fixed set of calls and write them into their rows."""
        small = self._small
        if not small:
            return
        self._small, self._small_values, self._cache = [], 0, None
        base = small[0][0]
        parts = tuple((row - base, index, tensor.numel()) for row, index, tensor in small)
        values = torch._C._nn.flatten_dense_tensors([tensor for _, _, tensor in small])  # float64 copies
        layout = self._layouts.get(parts)
        if layout is None:
            if len(self._layouts) >= 32:
                self._layouts.clear()
            layout = self._layouts[parts] = RecordLayout(parts, len(self.paths), self.hist_bins, values.device)
        moments = self._buffer(base + layout.span - 1, values.device)
        table = small_moments(values, layout, self.near_zero)
        counts = self._counts
        if any(counts[base + r][j] for r, j in layout.groups):  # some described in part already: merge (Chan)
            for g, (r, j) in enumerate(layout.groups):
                _merge_into(moments[base + r, j], table[g].float(), counts[base + r][j], layout.sizes[g])
        else:
            moments[base : base + layout.span].view(-1).index_copy_(0, layout.targets, table.view(-1).float())
        for (r, j), size in zip(layout.groups, layout.sizes, strict=True):
            counts[base + r][j] += size
        if self.with_hist and self._hists is not None:
            hist = small_hist(values, layout, self._hist_positions(layout, values))
            self._hists[base : base + layout.span].view(-1).add_(hist)

    def _hist_positions(self, layout: RecordLayout, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if layout.hist is None:
            scale, shift = self._tables(values.device)
            first: dict[int, int] = {}  # module without a range -> its first group (its first record)
            for g, (_, j) in enumerate(layout.groups):
                if self._scales[j] is None:
                    first.setdefault(j, g)
            if first:  # the ranges come from these first records: all missing modules at once
                largest = torch.full((len(layout.groups),), math.nan, dtype=torch.float64, device=values.device)
                largest.scatter_reduce_(0, layout.seg, values.abs(), "amax", include_self=False)
                rows = torch.tensor(list(first.values()), device=values.device)
                targets = torch.tensor(list(first), device=values.device)
                if self.hist_range is None:
                    new_scale, new_shift = scale_from_bound(largest.index_select(0, rows), self.hist_bins)
                else:
                    new_scale, new_shift = hist_scale(values, self.hist_bins, self.hist_range)
                scale.index_copy_(0, targets, new_scale.expand(len(first)))
                shift.index_copy_(0, targets, new_shift.expand(len(first)))
                for j in first:
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
