"""Tables of cells filled by observations and written in batches: `RecordTable` (moments records, histograms and
unit activity of activations) and `NormTable` (norm records of gradients, updates and weights).

The machinery `ActivationStats` and `watch()` share. Before: a hook hands a tensor to `RecordTable.stage`/`add`
(`hookscope.watch._recorder`, `hookscope.callbacks.ActivationStats`). After: the consumer reads the written cells
(`records`, `hists`, `norms`) and finalizes them (`_record.py`'s `finalize`, in `hookscope.watch._buffers`).

A table has a cell per (row, key): a row is a step of `watch()` or a record of `ActivationStats`, a key a module
or a parameter. Rows are addressed by ids that may grow without bound (a ring of steps): id `r` lives in row
`r % rows`, and the consumer makes sure a row is no longer needed before its id comes round again. An observation
is read when it is added and waits until `flush()`: a small tensor as a copy (`_small`); a large one at once (while
it is in cache and before an in-place op can change it) as its exact sums and a sample (`_sampled`,
`take_sample`) or, described exactly, as a finished item (`_large`). `flush()` describes everything waiting in a
fixed number of torch calls (the small tensors by segment reductions, `_batched.py`; the samples as rows,
`_rows.py`, then `estimate`) and combines every item with what its cell holds (`combine_segments`: a key called
twice in a row, a record flushed in two parts), histograms re-binned to the widest range first. Everything that
depends only on the arrangement of what waits (segments, cells) is built once per arrangement and cached, so a
steady training loop pays a fixed number of torch calls per flush, however many rows and keys it covers.

`PendingTable` is what both tables are: the cells and the observations waiting for them; each table describes
and writes its own kind of item (`_describe_waiting`, `_describe_sampled`, `flush`).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._transfer import to_device
from ._batched import Segments, Workspace, describe_segments, finite_mask, norm_segments
from ._describe import Sample, describe, estimate, sum_of_squares, take_sample
from ._histogram import EXPONENT_NONE, counts, exponent_of, rebin, row_counts, segment_counts
from ._norms import NORM, combine_norm_segments, estimate_norms, norm_of, real_view
from ._record import RECORD, Column, combine_segments, empty
from ._rows import SAMPLE_BLOCK, Rows, describe_rows, norm_rows
from ._sample import Sampler
from ._spec import Spec
from ._units import UnitCounts, active, unit_counts

__all__ = ["SMALL_BELOW", "Members", "NormTable", "Part", "PendingTable", "RecordTable", "small_copy"]

SMALL_BELOW = 1 << 14
"""Tensors with fewer values are copied and described in batches; larger ones are read when they are added (at
twice the sample width, sampling costs less than describing every value)."""

_CACHE = 64  # layouts kept per table (a steady loop needs a handful)
_CELL_CACHE = 16  # arrangements of cells kept per table
Part = tuple[int, int, tuple[int, ...]]  # (row, key, shape) of a small tensor waiting
Members = tuple[tuple[int, tuple[int, ...]], ...]  # (key, shape) of each tensor a waiting chunk holds, in order


class PendingTable(abc.ABC):
    """Cells, the observations waiting for them, and the cached layouts of what waits: what `RecordTable` and
    `NormTable` are.

    Args:
        keys: The number of keys.
        sampler: Read large tensors as sums and a sample (`None`: describe them exactly).
    """

    def __init__(self, keys: int, sampler: Sampler | None) -> None:
        self.keys = keys
        self.sampler = sampler
        self.rows = 0
        self.device: torch.device | None = None
        self.pending_values = 0
        self._small: list[tuple[int, Members, torch.Tensor]] = []  # (row, members, their values in one tensor)
        self._sampled: list[tuple[int, int, Sample, Any]] = []  # (row, key, sample, what the table needs of it)
        self._large: list[tuple[int, int, torch.Tensor]] = []  # (row, key, finished item)
        self._layouts: dict[Any, Any] = {}
        self._cell_layouts: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self._work = Workspace()  # what waits is described in its buffers

    @property
    def is_pending(self) -> bool:
        """Whether observations wait to be written."""
        return bool(self._small or self._sampled or self._large)

    def allocate(self, rows: int, device: torch.device) -> None:
        """Make room for `rows` rows on `device` (keeping what the cells hold)."""
        if self.device is not None and device != self.device:
            self.flush()
            self._move(device)
        self.device = device
        if rows > self.rows:
            self._grow(rows, device)
            self.rows = rows

    def _is_small(self, x: torch.Tensor) -> bool:
        return x.numel() < SMALL_BELOW and x.dtype != torch.float64

    def is_sampled(self, x: torch.Tensor) -> bool:
        """Whether `x` is read as its sums and a sample (a 16/32-bit float tensor of a sample's width or more, with
        a sampler)."""
        sampler = self.sampler
        return sampler is not None and x.is_floating_point() and x.dtype != torch.float64 and x.numel() >= sampler.size

    def _keep_small(self, row: int, key: int, x: torch.Tensor, owned: bool) -> None:
        self._small.append((row, ((key, tuple(x.shape)),), small_copy(x, owned)))
        self.pending_values += x.numel()

    def _keep_flat(self, row: int, keys: list[int], shapes: list[tuple[int, ...]], flat: torch.Tensor) -> None:
        self._small.append((row, tuple(zip(keys, shapes, strict=True)), flat))
        self.pending_values += flat.numel()

    def _layout(self, key: Any, build: Callable[[], Any]) -> Any:
        layout = self._layouts.get(key)
        if layout is None:
            if len(self._layouts) >= _CACHE:
                self._layouts.clear()
            layout = self._layouts[key] = build()
        return layout

    def _small_parts(self) -> tuple[int, tuple[Part, ...], torch.Tensor]:
        """The first row id of the small tensors waiting, them as (row relative to it, key, shape) (what a layout
        depends on: the same for every batch of a steady loop), and their values (flat, float64)."""
        small = self._small
        base = min(row for row, _, _ in small)
        parts = tuple((row - base, key, shape) for row, members, _ in small for key, shape in members)
        values = torch.cat([t.reshape(-1) for _, _, t in small]).double()
        return base, parts, values

    def _keep_sample(self, row: int, key: int, sample: Sample, plan: Any) -> None:
        self._sampled.append((row, key, sample, plan))
        self.pending_values += sample.values.numel()

    def _sample_blocks(self) -> list[list[tuple[int, int, Sample, Any]]]:
        """The samples waiting, in blocks of at most `SAMPLE_BLOCK`."""
        sampled = self._sampled
        return [sampled[start : start + SAMPLE_BLOCK] for start in range(0, len(sampled), SAMPLE_BLOCK)]

    def _sampled_values(
        self, sampled: list[tuple[int, int, Sample, Any]]
    ) -> tuple[tuple[tuple[int, int, int], ...], torch.Tensor, torch.Tensor]:
        """A block of samples as (key, count, numel) parts (what a layout depends on), their values as the rows of
        one (G, width) float32 matrix (`members` says which entries are the sample) and their exact readings
        (G, len(RAW))."""
        parts = tuple((key, s.count, s.numel) for _, key, s, _ in sampled)
        first = sampled[0][2].values
        out = self._work.buffer("values", len(sampled), first.numel(), first.dtype, first.device)
        values = torch.stack([s.values for _, _, s, _ in sampled], out=out)
        raw = torch.stack([reading.float() for _, _, s, _ in sampled for reading in s.raw]).view(len(sampled), -1)
        return parts, values, raw

    def members(self, parts: tuple[tuple[int, int, int], ...], width: int) -> torch.Tensor:
        """(G, width) float32: 1.0 for the entries of the rows of `_sampled_values` that are the samples, 0.0 for
        the padding."""
        counts = torch.tensor([count for _, count, _ in parts])
        members = (torch.arange(width)[None, :] < counts[:, None]).float()
        return to_device(members, self.device or torch.device("cpu"))

    def _cells(self, rows_and_keys: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The distinct cells of the items (row ids and keys, in item order) and, for each item then each cell,
        its position among them. A steady loop flushes the same arrangement of cells again and again, at other
        places of the ring of rows: the arrangement is cached relative to its first row (a cache of its own: other
        arrangements come round too often for the layouts'), and its cells moved to that row's slot."""
        first = min((row for row, _ in rows_and_keys), default=0)
        slot = first % self.rows
        if slot + max((row for row, _ in rows_and_keys), default=first) - first < self.rows:
            cells, offset = tuple((row - first) * self.keys + key for row, key in rows_and_keys), slot * self.keys
        else:  # the rows wrap round the ring: the arrangement of their slots
            cells, offset = tuple((row % self.rows) * self.keys + key for row, key in rows_and_keys), 0
        found = self._cell_layouts.get(cells)
        if found is None:
            if len(self._cell_layouts) >= _CELL_CACHE:
                self._cell_layouts.clear()
            found = self._cell_layouts[cells] = self._cell_layout(cells)
        unique, positions = found  # index tensors, never written
        return (unique + offset if offset else unique), positions

    def _cell_layout(self, cells: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        unique = list(dict.fromkeys(cells))
        where = {cell: k for k, cell in enumerate(unique)}
        positions = [where[cell] for cell in cells] + list(range(len(unique)))
        device = self.device or torch.device("cpu")
        return to_device(torch.tensor(unique), device), to_device(torch.tensor(positions), device)

    def _take(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Describe everything waiting and forget it: the items (one row each, in the table's item layout), the
        distinct cells they go to and, for each item then each cell, its position among them (`_cells`)."""
        items: list[torch.Tensor] = []
        cells: list[tuple[int, int]] = []
        if self._small:
            base, parts, values = self._small_parts()
            described, groups = self._describe_waiting(parts, values)
            items.append(described)
            cells += [(base + row, key) for row, key in groups]
        for block in self._sample_blocks():
            items.append(self._describe_sampled(block))
            cells += [(row, key) for row, key, _, _ in block]
        if self._large:
            items.append(torch.stack([item for _, _, item in self._large]))
            cells += [(row, key) for row, key, _ in self._large]
        self._clear()
        unique, segment = self._cells(cells)
        return torch.cat(items), unique, segment

    @abc.abstractmethod
    def _describe_waiting(
        self, parts: tuple[Part, ...], values: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """The items of the small tensors waiting (`_small_parts`) and the (row relative to the first, key) of each."""

    @abc.abstractmethod
    def _describe_sampled(self, block: list[tuple[int, int, Sample, Any]]) -> torch.Tensor:
        """The items of a block of samples, one per sample."""

    def _forget(self, row: int) -> None:
        """Forget what waits for row id `row`."""
        self._small = [item for item in self._small if item[0] != row]
        self._sampled = [item for item in self._sampled if item[0] != row]
        self._large = [item for item in self._large if item[0] != row]
        self.pending_values = sum(values.numel() for _, _, values in self._small)
        self.pending_values += sum(sample.values.numel() for _, _, sample, _ in self._sampled)

    def _clear(self) -> None:
        """Forget what waited (once it is written)."""
        self._small, self._sampled, self._large, self.pending_values = [], [], [], 0

    @abc.abstractmethod
    def flush(self) -> None:
        """Write every observation waiting into its cell."""

    @abc.abstractmethod
    def _grow(self, rows: int, device: torch.device) -> None:
        """Make the cells `rows` rows on `device`, keeping what they hold."""

    @abc.abstractmethod
    def _move(self, device: torch.device) -> None:
        """Move the cells to `device`."""


def small_copy(x: torch.Tensor, owned: bool = False) -> torch.Tensor:
    """What a table keeps of a small tensor: a float32 copy (in-place ops may follow the hook), or `x` itself when
    it is a float32 tensor nobody else holds (`owned`)."""
    if owned and x.dtype == torch.float32:
        return x
    source = x.detach() if x.requires_grad else x
    return source.clone() if source.dtype == torch.float32 else source.to(torch.float32)  # clone: the fastest


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
        if self.sampler is not None and self.is_sampled(x):
            sample = take_sample(x, self.sampler)
            return ("sampled", row, key, sample, self._unit_plan(key, tuple(x.shape), x.device))
        return ("large", row, key, *self._describe_exactly(key, x.detach()))

    @staticmethod
    def holds_nonfinite(staged: tuple[Any, ...]) -> torch.Tensor:
        """Whether the tensor `stage` read holds a non-finite value (0-d bool, on its device, no sync), from what it
        read: every value of a small copy, a sample's exact min and max, an exact record's count."""
        kind, read = staged[0], staged[3]
        found: torch.Tensor
        if kind == "sampled":
            _, _, smallest, largest = read.raw
            found = (smallest.isfinite() & largest.isfinite()).logical_not_()
        else:
            found = read.isfinite().all().logical_not_() if kind == "small" else read[Column.NONFINITE] > 0
        return found

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

    def load_units(self, counts: list[torch.Tensor | None], device: torch.device) -> None:
        """Replace the unit counts by `counts` (`UnitCounts.state`) on `device`. What waits is written first (its
        unit positions are the old ones), and the layouts, which hold unit positions, are built afresh."""
        self.flush()
        self.units.load(counts, device)
        self._layouts.clear()

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
        self, values: torch.Tensor, finite: torch.Tensor, segments: Segments, record: torch.Tensor
    ) -> list[torch.Tensor]:
        """Histogram counts (groups, bins + 2) and exponents (groups, 1) of grouped values (`finite`: their
        `finite_mask`)."""
        bins, seg, groups = self.bins or 0, segments.segment, segments.groups
        if self.hist_range is not None:
            exponents = torch.full((groups,), EXPONENT_NONE, dtype=torch.int64, device=values.device)
            hist = segment_counts(values, finite, seg, groups, bins, None, self.hist_range)
        else:
            exponents = exponent_of(_largest(record))
            hist = segment_counts(values, finite, seg, groups, bins, exponents, spread=segments.spread, work=self._work)
        return [hist, exponents[:, None].double()]

    def _describe_small(self, values: torch.Tensor, layout: _SmallLayout) -> torch.Tensor:
        """(groups, width) records (+ histogram and exponent) of the small values; unit activity added."""
        finite = finite_mask(values, out=self._work.flat("finite", values.numel(), values.dtype, values.device))
        record = describe_segments(values, layout.segments, self.spec, finite, self._work)
        parts = [record]
        if self.bins is not None:
            parts += self._hist_columns(values, finite, layout.segments, record)
        if layout.units is not None and layout.unit_sizes is not None:
            self.units.add_whole(layout.units, active(values), *layout.unit_sizes)
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
            ids = layout.unit_ids(block)
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
        # equivalent mutant `and -> or`: hists and exponents are None together or set together (`_grow`, `_move`)
        if self.hists is not None and self.exponents is not None:
            self.hists.index_fill_(0, rows, 0.0)
            self.exponents.index_fill_(0, rows, EXPONENT_NONE)

    def _empty_row(self, device: torch.device) -> torch.Tensor:
        """(keys, len(RECORD)) empty records; `saturated` 0 for saturating keys, NaN for the others."""
        row = self._empty
        if row is None or row.device != device:
            row = empty((self.keys,), saturating=True)
            row[:, Column.SATURATED] = torch.tensor([0.0 if b else math.nan for b in self.saturation]).double()
            row = self._empty = to_device(row, device)
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
        self._cell_layouts.clear()
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
        self.units: torch.Tensor | None = None  # each value's position in the unit counts (0: no unit)
        self.unit_sizes: tuple[torch.Tensor, torch.Tensor] | None = None  # each position once, and its values
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
            every = np.concatenate(ids)
            self.units = to_device(torch.from_numpy(every), device)
            positions, seen = np.unique(every, return_counts=True)  # the values seen at each position
            self.unit_sizes = (
                to_device(torch.from_numpy(positions), device),
                to_device(torch.from_numpy(seen.astype(np.float64)), device),
            )


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
        self.units: list[tuple[int, int, int]] | None = None  # per row: inner, units, start
        self._ids: tuple[torch.Tensor, ...] | None = None
        if any(plan is not None for plan in plans):
            rows = [plan if plan is not None else (0, 1, 1, 0) for plan in plans]  # position 0: no unit
            self.units = [(inner, units, start) for start, inner, units, _ in rows]

    def unit_ids(self, block: list[tuple[int, int, Any, Any]]) -> torch.Tensor:
        """(G, width) the position in the unit counts of each sampled value of `block` (its sample's `start` added
        to its position before it, `comb`): `(position // inner) % units + start` of its row's plan, 0 without one.

        `comb` is the same for every block of this layout: its quotient by `inner` (reduced, plus the row's start)
        and its remainder are computed once; a block adds the quotient and the remainder of its starts (host ints)
        and one carry, in int32 where every number fits: a few cheap passes instead of a division and a remainder
        per value."""
        units = self.units or []
        if self._ids is None:
            self._ids = self._unit_parts(block)
        below, rest, limit, count = self._ids
        starts = [sample.start for _, _, sample, _ in block]
        shifts = [((s // inner) % n, inner - s % inner) for s, (inner, n, _) in zip(starts, units, strict=True)]
        shift = to_device(torch.tensor(shifts, dtype=below.dtype).T.unsqueeze(-1), below.device)  # (2, G, 1)
        out = below.add(shift[0])
        out += rest >= shift[1]  # the carry: the two remainders add up to `inner` or more
        return out.sub_((out >= limit) * count)  # below 2 * units before: one wrap at most

    def _unit_parts(self, block: list[tuple[int, int, Any, Any]]) -> tuple[torch.Tensor, ...]:
        """(G, width) `(comb // inner) % units + start` and `comb % inner`, then (G, 1) `start + units` and
        `units`: int32 unless a number may not fit."""
        units = self.units or []
        largest = max(*(sample.numel for _, _, sample, _ in block), *(inner for inner, _, _ in units))
        dtype = torch.int32 if largest + max(start + count for _, count, start in units) < 2**31 else torch.int64
        combs = torch.stack([sample.comb for _, _, sample, _ in block])
        plan = to_device(torch.tensor(units, dtype=torch.int64).T.unsqueeze(-1), combs.device)  # (3, G, 1)
        inner, count, start = plan.unbind(0)
        below = torch.div(combs, inner, rounding_mode="floor").remainder_(count).add_(start)
        rest = combs.remainder(inner)
        return below.to(dtype), rest.to(dtype), (start + count).to(dtype), count.to(dtype)


class NormTable(PendingTable):
    """Norm records (`NORM`: the norm of the finite values, non-finite and value counts, sampled count) per cell.

    Args:
        keys: The number of keys (modules or parameters).
        sampler: Read large tensors as sums and a sample (`None`: exactly). On the CPU, a large tensor whose
            float32 sum of squares is finite has no non-finite value, and the root of that sum is its exact norm:
            it is read once, and its sample taken only otherwise.
        count_nonfinite: Read whether a large tensor holds a non-finite value exactly (a min/max pass, on the CPU
            only when its sum of squares is not finite; how many it holds is estimated from the sample, at least
            1): a sum of squares overflows float32 for a norm above about 1.8e19 of finite values (an exploding
            gradient). `False` where only the norms are read (update ratios): a non-finite sum of squares then
            stands for a non-finite value.
    """

    def __init__(self, keys: int, sampler: Sampler | None = None, *, count_nonfinite: bool = True) -> None:
        super().__init__(keys, sampler)
        self.count_nonfinite = count_nonfinite
        self.norms: torch.Tensor | None = None  # (rows, keys, len(NORM)) float64

    def add(self, row: int, key: int, x: torch.Tensor, *, owned: bool = False) -> None:
        """Observe `x` in cell (row id, key) (complex tensors count |z|)."""
        if x.is_complex():
            x, owned = real_view(x.detach()), False
        if x.numel() == 0:
            return
        if self._is_small(x):
            self._keep_small(row, key, x, owned)
        elif self.sampler is not None and self.is_sampled(x):
            squares = sum_of_squares(x)
            if x.device.type == "cpu":  # there, reading it is no sync: when it is finite, so is every value, and
                total = float(squares)  # its root is the exact norm (no min/max pass, no sample)
                if math.isfinite(total):
                    record = (math.sqrt(total), 0.0, float(x.numel()), 0.0)
                    self._large.append((row, key, torch.tensor(record, dtype=torch.float64)))
                    return
            sample = take_sample(x, self.sampler, with_sum=False, with_extremes=self.count_nonfinite, squares=squares)
            self._keep_sample(row, key, sample, None)
        else:
            self._large.append((row, key, norm_of(x.detach())))

    def add_flat(self, row: int, keys: list[int], shapes: list[tuple[int, ...]], flat: torch.Tensor) -> None:
        """Observe several small tensors of row id `row` given concatenated in `flat` (a float32 tensor nobody else
        holds: the parameters of an optimizer step in one copy), `keys[i]` of shape `shapes[i]`."""
        self._keep_flat(row, keys, shapes, flat)

    def add_sample(self, row: int, key: int, sample: Sample) -> None:
        """Observe a tensor read as `sample` alone (`sample_alone`: the change of a large weight) in cell (row id,
        key): its norm is estimated from the sample."""
        self._keep_sample(row, key, sample, None)

    def add_record(self, row: int, key: int, norm: torch.Tensor) -> None:
        """Add a norm record made elsewhere (a compiled backward's, for instance) to cell (row id, key)."""
        self._large.append((row, key, norm.double()))

    def reset(self, rows: torch.Tensor) -> None:
        """Empty the cells of `rows` (an int64 tensor of rows, on the table's device)."""
        if self.norms is not None:
            self.norms.index_fill_(0, rows, 0.0)

    def discard(self, row: int) -> None:
        """Empty the cells of row id `row`, what waits for them and what was written (its observations are replaced
        by later ones)."""
        self._forget(row)
        if self.norms is not None:
            self.norms[row % self.rows].zero_()

    def flush(self) -> None:
        """Write every observation waiting into its cell: a fixed number of torch calls."""
        if not self.is_pending or self.norms is None:
            return
        items, unique, segment = self._take()
        norms = self.norms.view(-1, len(NORM))
        every = torch.cat([items, norms.index_select(0, unique)])
        norms.index_copy_(0, unique, combine_norm_segments(every, segment, unique.numel()))

    def _describe_waiting(
        self, parts: tuple[Part, ...], values: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        segments, groups = self._layout(("small", parts), lambda: self._small_layout(parts))
        return norm_segments(values, segments, self._work), groups

    def _small_layout(
        self, parts: tuple[tuple[int, int, tuple[int, ...]], ...]
    ) -> tuple[Segments, list[tuple[int, int]]]:
        """Each part described on its own (the flush merges the parts of a cell)."""
        sizes = [math.prod(shape) for _, _, shape in parts]
        segments = Segments(sizes, list(range(len(parts))), self.device or torch.device("cpu"))
        return segments, [(row, key) for row, key, _ in parts]

    def _describe_sampled(self, block: list[tuple[int, int, Any, Any]]) -> torch.Tensor:
        """The norm records of a block of sampled tensors."""
        parts, values, raw = self._sampled_values(block)
        members, numel = self._layout(("sampled", parts), lambda: self._sampled_layout(parts, values.shape[1]))
        return estimate_norms(raw, numel, norm_rows(Rows(values, members, self._work)))

    def _sampled_layout(self, parts: tuple[tuple[int, int, int], ...], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.device or torch.device("cpu")
        numel = torch.tensor([float(n) for _, _, n in parts], dtype=torch.float64)
        return self.members(parts, width), to_device(numel, device)

    def _grow(self, rows: int, device: torch.device) -> None:
        norms = torch.zeros(rows, self.keys, len(NORM), dtype=torch.float64, device=device)
        if self.norms is not None:
            norms[: self.rows] = self.norms
        self.norms = norms

    def _move(self, device: torch.device) -> None:
        if self.norms is not None:
            self.norms = self.norms.to(device)
        self._layouts.clear()
        self._cell_layouts.clear()
