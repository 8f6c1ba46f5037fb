"""`RecordTable`: moments records, histograms and unit activity of observed tensors per cell, written in batches.

The machinery `ActivationStats` and `watch()` share (see `_pending.py` for cells and rows). A tensor added to a
cell is copied when small; when large it is read at once (its exact sums and a sample, or every value when the
table is exact) while it is in cache and before an in-place op can change it. `flush()` describes everything
waiting in a fixed number of torch calls: the small tensors by segment reductions, the samples likewise and
then `estimate`, and every record waiting for a cell is combined with what the cell holds (`combine_segments`:
a key called twice in a row, a record flushed in two parts), histograms re-binned to the widest range first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ._batched import Segments, describe_segments
from ._describe import describe, estimate, take_sample
from ._histogram import EXPONENT_NONE, counts, exponent_of, rebin, row_counts, segment_counts
from ._pending import Part, PendingTable, small_copy, to_device
from ._record import RECORD, Column, combine_segments, empty
from ._rows import Rows, describe_rows
from ._sample import Sampler
from ._spec import Spec
from ._units import UnitCounts, active, unit_counts

__all__ = ["RecordTable"]

UnitPlan = tuple[int, int, int, int]  # (start in the unit counts, values between two units, units, unit dim)


class RecordTable(PendingTable):
    """Moments records (and histograms, unit activity) of observed tensors, per (row, key) cell.

    Args:
        keys: The number of keys (modules).
        spec: The near-zero rule.
        bins: Histogram bins (`None`: no histograms).
        hist_range: A fixed histogram range, or `None` for the range that follows the data.
        saturation: Per key, the bounds of a saturating module or `None` (`None`: no key saturates).
        sampler: Read large tensors as sums and a sample (`None`: describe every value).
        unit_dim: `(key, ndim) -> unit dim or None`, to count unit activity (`None`: no unit activity).
    """

    def __init__(
        self,
        keys: int,
        spec: Spec,
        *,
        bins: int | None = None,
        hist_range: tuple[float, float] | None = None,
        saturation: list[tuple[float, float] | None] | None = None,
        sampler: Sampler | None = None,
        unit_dim: Callable[[int, int], int | None] | None = None,
    ) -> None:
        super().__init__(keys, sampler)
        self.spec, self.bins, self.hist_range, self.unit_dim = spec, bins, hist_range, unit_dim
        self.saturation = saturation or [None] * keys
        self._specs = [Spec(spec.near_zero, spec.signed, bounds) for bounds in self.saturation]
        self.records: torch.Tensor | None = None  # (rows, keys, len(RECORD)) float64
        self.hists: torch.Tensor | None = None  # (rows, keys, bins + 2) float64
        self.exponents: torch.Tensor | None = None  # (rows, keys) int64
        self.units = UnitCounts(keys)
        self._empty: torch.Tensor | None = None

    # ---- observing -------------------------------------------------------------------------------------------
    def add(self, row: int, key: int, x: torch.Tensor, *, owned: bool = False) -> None:
        """Observe `x` (a real tensor) in cell (row id, key); `owned`: `x` is a float32 copy nobody else holds."""
        staged = self.stage(row, key, x, owned=owned)
        if staged is not None:
            self.commit(staged)

    def stage(self, row: int, key: int, x: torch.Tensor, *, owned: bool = False) -> tuple[Any, ...] | None:
        """Read `x` as `add` does (a copy, or its sums and a sample, or every value), but keep nothing yet: return
        what `commit` keeps, so that the observations of a forward are kept only once it has completed."""
        if x.numel() == 0:
            return None
        if self._is_small(x):
            return ("small", row, ((key, tuple(x.shape)),), small_copy(x, owned))
        if self.sampler is not None and self._is_sampled(x):
            sample = take_sample(x, self.sampler)
            return ("sampled", row, key, sample, self._unit_plan(key, tuple(x.shape), x.device))
        return ("large", row, key, *self._describe_exactly(key, x.detach()))

    def commit(self, staged: tuple[Any, ...], row: int | None = None) -> None:
        """Keep what `stage` read, in row id `row` (default: the one it was read for)."""
        kind, read_for, *rest = staged
        row = read_for if row is None else row
        if kind == "small":
            members, values = rest
            self._small.append((row, members, values))
            self.pending_values += values.numel()
        elif kind == "sampled":
            self._keep_sample(row, *rest)
        else:
            key, item, units = rest
            self._large.append((row, key, item))
            if units is not None:
                self.units.add(*units)

    def _describe_exactly(self, key: int, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The finished item (record, histogram, exponent) of `x`, every value described, and its unit counts
        (`(positions, active, seen)` for `UnitCounts.add`, or `None`)."""
        described = describe(x, self._specs[key])
        item = [described.record]
        if self.bins is not None:
            if self.hist_range is not None:
                exponent = torch.full((1,), EXPONENT_NONE, dtype=torch.int64, device=x.device)
                item += [counts(described.values, described.finite, self.bins, None, self.hist_range), exponent]
            else:
                exponent = exponent_of(_largest(described.record[None]))
                item += [counts(described.values, described.finite, self.bins, exponent[0]), exponent]
        plan = self._unit_plan(key, tuple(x.shape), x.device)
        units = None
        if plan is not None:
            start, _, count, dim = plan
            positions = torch.arange(start, start + count, device=x.device)
            units = (positions, unit_counts(described, tuple(x.shape), dim), x.numel() / count)
        return torch.cat([t.reshape(-1).double() for t in item]), units

    def _unit_plan(self, key: int, shape: tuple[int, ...], device: torch.device) -> UnitPlan | None:
        """`(start, inner, units, dim)` of `key`'s unit counts for an output of `shape` (`inner`: the values
        between two units in row-major order). `None`: no unit activity for it."""
        unit = self.unit_dim(key, len(shape)) if self.unit_dim is not None else None
        start = None if unit is None else self.units.slot(key, shape[unit], device)
        if unit is None or start is None:
            return None
        return start, math.prod(shape[unit + 1 :]), shape[unit], unit

    def unit_activity(self) -> list[torch.Tensor | None]:
        """Per key, the fraction of its observed values that were active, per unit (`None` before any)."""
        self.flush()
        return self.units.fractions()

    # ---- writing ---------------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write every observation waiting into its cell: a fixed number of torch calls."""
        if not self.is_pending or self.records is None:
            return
        merged, unique, segment = self._take()
        width = len(RECORD)
        records = self.records.view(-1, width)
        every = torch.cat([merged[:, :width], records.index_select(0, unique)])
        records.index_copy_(0, unique, combine_segments(every, segment, unique.numel()))
        if self.bins is not None:
            self._flush_hists(merged, unique, segment)

    def _describe_waiting(
        self, parts: tuple[Part, ...], values: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        layout = self._layout(("small", parts), lambda: _SmallLayout(parts, self))
        return self._describe_small(values, layout), layout.groups

    def _hist_columns(
        self, values: torch.Tensor, segments: Segments, record: torch.Tensor, weight: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Histogram counts (groups, bins + 2) and exponents (groups, 1) of grouped values (each counting
        `weight[g]` of its group's values)."""
        bins, finite = self.bins or 0, torch.isfinite(values).double()
        if self.hist_range is not None:
            exponents = torch.full((segments.groups,), EXPONENT_NONE, dtype=torch.int64, device=values.device)
            hist = segment_counts(values, finite, segments.segment, segments.groups, bins, None, self.hist_range)
        else:
            exponents = exponent_of(_largest(record))
            hist = segment_counts(values, finite, segments.segment, segments.groups, bins, exponents)
        return [hist if weight is None else hist * weight[:, None], exponents[:, None].double()]

    def _describe_small(self, values: torch.Tensor, layout: _SmallLayout) -> torch.Tensor:
        """(groups, width) records (+ histogram and exponent) of the small values; unit activity added."""
        record = describe_segments(values, layout.segments, self.spec)
        parts = [record] + (self._hist_columns(values, layout.segments, record) if self.bins is not None else [])
        if layout.units is not None:
            self.units.add(layout.units, active(values), 1.0)
        return torch.cat(parts, dim=1)

    def _describe_sampled(self, block: list[tuple[int, int, Any, Any]]) -> torch.Tensor:
        """(samples, width) records (+ histogram and exponent) of a block of sampled tensors; unit activity added."""
        parts, values, raw = self._sampled_values(block)
        plans = tuple(plan for _, _, _, plan in block)
        layout = self._layout(("sampled", parts, plans), lambda: _SampledLayout(parts, plans, values.shape[1], self))
        rows = Rows(values, layout.members, self._work)
        sampled = describe_rows(rows, self.spec, layout.saturation)
        record = estimate(raw, layout.numel, sampled)
        weight = record[:, Column.COUNT] / sampled[:, Column.COUNT].clamp(min=1)  # the values a sampled one stands for
        columns = [record]
        if self.bins is not None:
            if self.hist_range is not None:
                exponents = torch.full((len(parts),), EXPONENT_NONE, dtype=torch.int64, device=values.device)
                hist = row_counts(values, rows.finite, self.bins, None, self.hist_range)
            else:
                exponents = exponent_of(_largest(record))
                hist = row_counts(values, rows.finite, self.bins, exponents)
            columns += [hist.mul_(weight[:, None]), exponents[:, None].double()]
        if layout.units is not None:
            starts = to_device(torch.tensor([sample.start for _, _, sample, _ in block])[:, None], values.device)
            index = layout.combs(block).add(starts)
            inner, units, start = layout.units
            ids = torch.div(index, inner, rounding_mode="floor").remainder_(units).add_(start).mul_(start > 0)
            stands_for = layout.members * weight.float()[:, None]
            on = torch.sign(rows.clean).clamp_(min=0.0).mul_(stands_for)  # active: finite and > 0
            self.units.add(ids.reshape(-1), on.reshape(-1), stands_for.reshape(-1))
        return torch.cat(columns, dim=1)

    def _flush_hists(self, items: torch.Tensor, unique: torch.Tensor, segment: torch.Tensor) -> None:
        if self.hists is None or self.exponents is None:
            return
        width, hist_width = len(RECORD), (self.bins or 0) + 2
        hists, exponents = self.hists.view(-1, hist_width), self.exponents.view(-1)
        every = torch.cat([items[:, width : width + hist_width], hists.index_select(0, unique)])
        powers = torch.cat([items[:, width + hist_width].long(), exponents.index_select(0, unique)])
        groups = unique.numel()
        target = torch.full((groups,), EXPONENT_NONE, dtype=torch.int64, device=powers.device)
        target.scatter_reduce_(0, segment, powers, "amax")
        if self.hist_range is None:
            every = rebin(every, powers, target.index_select(0, segment))
        merged = torch.zeros(groups, hist_width, dtype=torch.float64, device=every.device).index_add_(0, segment, every)
        hists.index_copy_(0, unique, merged)
        exponents.index_copy_(0, unique, target)

    # ---- rows ------------------------------------------------------------------------------------------------
    def reset(self, rows: torch.Tensor) -> None:
        """Empty the cells of `rows` (an int64 tensor of rows, on the table's device): one call per table."""
        if self.records is not None:
            self.records.index_copy_(0, rows, self._empty_row(self.records.device).expand(len(rows), -1, -1))
        if self.hists is not None and self.exponents is not None:
            self.hists.index_fill_(0, rows, 0.0)
            self.exponents.index_fill_(0, rows, EXPONENT_NONE)

    def _empty_row(self, device: torch.device) -> torch.Tensor:
        """(keys, len(RECORD)) empty records; `saturated` 0 for saturating keys, NaN for the others."""
        row = self._empty
        if row is None or row.device != device:
            row = empty((self.keys,), saturating=True)
            row[:, Column.SATURATED] = torch.tensor([0.0 if b else math.nan for b in self.saturation]).double()
            row = self._empty = row.to(device)
        return row

    def _grow(self, rows: int, device: torch.device) -> None:
        old = self.rows
        records = self._empty_row(device).repeat(rows, 1, 1)
        if self.records is not None:
            records[:old] = self.records
        self.records = records
        if self.bins is not None:
            hists = torch.zeros(rows, self.keys, self.bins + 2, dtype=torch.float64, device=device)
            exponents = torch.full((rows, self.keys), EXPONENT_NONE, dtype=torch.int64, device=device)
            if self.hists is not None and self.exponents is not None:
                hists[:old], exponents[:old] = self.hists, self.exponents
            self.hists, self.exponents = hists, exponents

    def _move(self, device: torch.device) -> None:
        for name in ("records", "hists", "exponents"):
            tensor = getattr(self, name)
            if tensor is not None:
                setattr(self, name, tensor.to(device))
        if self.units.active is not None and self.units.seen is not None:
            self.units.active, self.units.seen = self.units.active.to(device), self.units.seen.to(device)
        self._layouts.clear()


def _largest(records: torch.Tensor) -> torch.Tensor:
    """The largest finite magnitude of each record's values (0 when it has none)."""
    largest = torch.maximum(records[:, Column.MIN].abs(), records[:, Column.MAX].abs())
    return torch.where(records[:, Column.COUNT] > 0, largest, 0.0)


class _SmallLayout:
    """What depends only on the arrangement of the small tensors waiting: segments, cells, unit positions. Each
    part is described on its own (contiguous values: the fastest segment sums); the flush merges the parts of a
    cell (a module called twice in a step)."""

    def __init__(self, parts: tuple[Part, ...], table: RecordTable) -> None:
        device = table.device or torch.device("cpu")
        sizes = [math.prod(shape) for _, _, shape in parts]
        self.segments = Segments(sizes, list(range(len(parts))), device, [table.saturation[key] for _, key, _ in parts])
        self.groups = [(row, key) for row, key, _ in parts]  # (row relative to the first one waiting, key)
        self.units: torch.Tensor | None = None
        if table.unit_dim is not None:
            self._unit_ids(parts, sizes, table, device)

    def _unit_ids(self, parts: tuple[Part, ...], sizes: list[int], table: RecordTable, device: torch.device) -> None:
        ids = []
        for (_, key, shape), size in zip(parts, sizes, strict=True):
            unit = table.unit_dim(key, len(shape)) if table.unit_dim is not None else None
            start = None if unit is None else table.units.slot(key, shape[unit], device)
            if unit is None or start is None:
                ids.append(np.zeros(size, dtype=np.int64))
                continue
            view = [1] * len(shape)
            view[unit] = shape[unit]
            ids.append(np.broadcast_to(np.arange(start, start + shape[unit]).reshape(view), shape).reshape(-1))
        if ids and any(i.any() for i in ids):
            self.units = to_device(torch.from_numpy(np.concatenate(ids)), device)


class _SampledLayout:
    """What depends only on the arrangement of the samples waiting: which entries are samples, the tensors' sizes,
    the saturation ranges and the per-row unit plans."""

    def __init__(
        self, parts: tuple[tuple[int, int, int], ...], plans: tuple[Any, ...], width: int, table: RecordTable
    ) -> None:
        device = table.device or torch.device("cpu")
        self.members = table.members(parts, width)
        self.numel = to_device(torch.tensor([float(n) for _, _, n in parts], dtype=torch.float64), device)
        bounds = [table.saturation[key] for key, _, _ in parts]
        self.saturation: tuple[torch.Tensor, torch.Tensor] | None = None
        if any(b is not None for b in bounds):
            middle = [math.nan if b is None else (b[0] + b[1]) / 2 for b in bounds]
            half = [math.nan if b is None else 0.49 * (b[1] - b[0]) for b in bounds]
            self.saturation = (  # float32, as the samples
                to_device(torch.tensor(middle, dtype=torch.float32), device),
                to_device(torch.tensor(half, dtype=torch.float32), device),
            )
        self.units: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._combs: torch.Tensor | None = None
        if any(plan is not None for plan in plans):
            rows = [plan if plan is not None else (0, 1, 1, 0) for plan in plans]  # position 0: no unit

            def column(at: int) -> torch.Tensor:
                return to_device(torch.tensor([row[at] for row in rows], dtype=torch.int64)[:, None], device)

            self.units = (column(1), column(2), column(0))  # inner, units, start

    def combs(self, block: list[tuple[int, int, Any, Any]]) -> torch.Tensor:
        """(G, width) the samples' positions before their starts (the same for every block of this layout)."""
        if self._combs is None:
            self._combs = torch.stack([sample.comb for _, _, sample, _ in block])
        return self._combs
