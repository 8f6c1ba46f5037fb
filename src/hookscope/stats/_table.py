"""Tables of records on the device, filled by observations: small tensors batched, large ones described at once.

A table has a cell per (row, key): a row is a step of `watch()` or a record of `ActivationStats`, a key a module
or a parameter. Rows are addressed by ids that may grow without bound (a ring of steps): id `r` lives in row
`r % rows`, and the consumer makes sure a row is no longer needed before its id comes round again. `RecordTable` keeps each cell's moments record and, optionally, its histogram (with the exponent
of its range) and each key's unit activity; `NormTable` keeps norm records (gradients). Observations are added
as hooks see them (`add`): a tensor of fewer than `SMALL_BELOW` values is copied (float32) and waits; a larger
one is described at once (in cache, before an in-place op can change it; sampled unless the table is exact) and
its record waits. `flush()` writes everything waiting in a fixed number of torch calls, however many rows and
keys: the small tensors are concatenated and described by segment reductions (`_batched.py`), and every record
waiting for a cell is combined with what the cell holds (`combine_segments`: a key called twice in a row, a
record flushed in two parts), histograms re-binned to the widest range first. On small models the cost of
monitoring is the number of torch calls, so this is what makes it cheap. The rows are the consumer's to manage.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ._batched import Segments, describe_segments, norm_segments
from ._describe import Described, describe_large
from ._histogram import EXPONENT_NONE, counts, exponent_of, rebin, segment_counts
from ._norms import NORM, combine_norm_segments, norm_of
from ._record import RECORD, Column, combine_segments, empty
from ._sample import Sampler
from ._spec import Spec
from ._units import active, unit_counts

__all__ = ["SMALL_BELOW", "NormTable", "RecordTable"]

SMALL_BELOW = 1 << 15
"""Tensors with fewer values are copied and described in batches; larger ones when they are added."""

_CACHE = 64  # layouts kept per table (a steady loop needs a handful)
Part = tuple[int, int, tuple[int, ...]]  # (row, key, shape) of a small tensor waiting
Members = tuple[tuple[int, tuple[int, ...]], ...]  # (key, shape) of each tensor a waiting chunk holds, in order


class _Table:
    """Cells, the observations waiting for them, and the cached layouts of batches of small tensors."""

    width: int

    def __init__(self, keys: int, sampler: Sampler | None) -> None:
        self.keys = keys
        self.sampler = sampler
        self.rows = 0
        self.device: torch.device | None = None
        self.pending_values = 0
        self._small: list[tuple[int, Members, torch.Tensor]] = []  # (row, members, their values in one tensor)
        self._large: list[tuple[int, int, torch.Tensor]] = []
        self._layouts: dict[tuple[Part, ...], Any] = {}

    @property
    def is_pending(self) -> bool:
        """Whether observations wait to be written."""
        return bool(self._small or self._large)

    def allocate(self, rows: int, device: torch.device) -> None:
        """Make room for `rows` rows on `device` (keeping what the cells hold)."""
        if self.device is not None and device != self.device:
            self.flush()
            self._move(device)
        self.device = device
        if rows > self.rows:
            self._grow(rows, device)
            self.rows = rows

    def _keep_small(self, row: int, key: int, x: torch.Tensor, owned: bool) -> None:
        if not owned or x.dtype != torch.float32:
            x = (x.detach() if x.requires_grad else x).to(torch.float32, copy=True)  # in-place ops may follow
        self._small.append((row, ((key, tuple(x.shape)),), x))
        self.pending_values += x.numel()

    def _values(self, small: list[tuple[int, Members, torch.Tensor]]) -> torch.Tensor:
        """Every waiting small value, flat, float64."""
        return torch._C._nn.flatten_dense_tensors([t for _, _, t in small]).double()

    def _layout(self, parts: tuple[Part, ...], build: Callable[[tuple[Part, ...]], Any]) -> Any:
        layout = self._layouts.get(parts)
        if layout is None:
            if len(self._layouts) >= _CACHE:
                self._layouts.clear()
            layout = self._layouts[parts] = build(parts)
        return layout

    def _take_pending(self) -> tuple[list[tuple[int, Members, torch.Tensor]], list[tuple[int, int, torch.Tensor]]]:
        small, large = self._small, self._large
        self._small, self._large, self.pending_values = [], [], 0
        return small, large

    def _small_parts(self, small: list[tuple[int, Members, torch.Tensor]]) -> tuple[int, tuple[Part, ...]]:
        """The first row id waiting, and the waiting small tensors as (row relative to it, key, shape): what a
        layout depends on, the same for every batch of a steady loop."""
        base = min(row for row, _, _ in small)
        return base, tuple((row - base, key, shape) for row, members, _ in small for key, shape in members)

    def _cells(
        self, base: int, groups: list[tuple[int, int]], large: list[tuple[int, int, torch.Tensor]]
    ) -> tuple[torch.Tensor, ...]:
        """The distinct cells written, and for each item (small groups at rows relative to `base`, then large
        records) its cell's position among them (then the positions of the cells themselves)."""
        rows, keys = self.rows, self.keys
        cells = [((base + row) % rows) * keys + key for row, key in groups]
        cells += [(row % rows) * keys + key for row, key, _ in large]
        unique = list(dict.fromkeys(cells))
        where = {cell: k for k, cell in enumerate(unique)}
        device = self.device or torch.device("cpu")
        return _to(torch.tensor(unique), device), _to(
            torch.tensor([where[c] for c in cells] + list(range(len(unique)))), device
        )

    def flush(self) -> None:
        """Write every observation waiting into its cell."""
        raise NotImplementedError

    def _grow(self, rows: int, device: torch.device) -> None:
        raise NotImplementedError

    def _move(self, device: torch.device) -> None:
        raise NotImplementedError


class RecordTable(_Table):
    """Moments records (and histograms, unit activity) of observed tensors, per (row, key) cell.

    Args:
        keys: The number of keys (modules).
        spec: The near-zero rule.
        bins: Histogram bins (`None`: no histograms).
        hist_range: A fixed histogram range, or `None` for the automatic range.
        saturation: Per key, the bounds of a saturating module or `None` (`None`: no key saturates).
        sampler: Describe large tensors from a sample (`None`: exactly).
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
        self.units: torch.Tensor | None = None  # flat float64 active counts; position 0 absorbs values of no unit
        self.unit_slots: list[tuple[int, int] | None] = [None] * keys  # (start, units)
        self.unit_values = [0.0] * keys  # values observed per unit, per key
        self.unit_mismatch = 0  # observations whose unit count differs from the key's first one
        self._empty: torch.Tensor | None = None

    def add(self, row: int, key: int, x: torch.Tensor, *, owned: bool = False) -> None:
        """Observe `x` (a real tensor) in cell (row, key); `owned`: `x` is a float32 copy nobody else holds."""
        if x.numel() == 0:
            return
        if x.numel() < SMALL_BELOW and x.dtype != torch.float64:
            self._keep_small(row, key, x, owned)
            return
        described = describe_large(x.detach(), self._specs[key], self.sampler)
        item = [described.record]
        if self.bins is not None:
            item += list(self._large_hist(described))
        self._large.append((row, key, torch.cat([t.reshape(-1).double() for t in item])))
        if self.unit_dim is not None:
            self._large_units(key, tuple(x.shape), described)

    def _large_hist(self, described: Described) -> tuple[torch.Tensor, torch.Tensor]:
        bins, record = self.bins or 0, described.record
        values, finite, weight = described.values, described.finite, described.weight
        if self.hist_range is not None:
            exponent = torch.full((), EXPONENT_NONE, dtype=torch.int64, device=record.device)
            return counts(values, finite, bins, None, self.hist_range, weight), exponent
        largest = torch.maximum(record[Column.MIN].abs(), record[Column.MAX].abs())
        exponent = exponent_of(torch.where(record[Column.COUNT] > 0, largest, 0.0))
        return counts(values, finite, bins, exponent, weight=weight), exponent

    def _large_units(self, key: int, shape: tuple[int, ...], described: Described) -> None:
        unit = self.unit_dim(key, len(shape)) if self.unit_dim is not None else None
        start = None if unit is None else self._unit_slot(key, shape[unit], described.values.device)
        if unit is None or start is None or self.units is None:
            self.unit_mismatch += unit is not None
            return
        self.units[start : start + shape[unit]].add_(unit_counts(described, shape, unit))
        self.unit_values[key] += math.prod(shape) / shape[unit]

    def _unit_slot(self, key: int, units: int, device: torch.device) -> int | None:
        """The first position of `key`'s counts (allocated once); `None` if its number of units changed."""
        slot = self.unit_slots[key]
        if slot is not None:
            return slot[0] if slot[1] == units else None
        start = 1 + sum(s[1] for s in self.unit_slots if s is not None)
        self.unit_slots[key] = (start, units)
        size = start + units
        if self.units is None or self.units.numel() < size:
            grown = torch.zeros(max(2 * size, 64), dtype=torch.float64, device=device)
            if self.units is not None:
                grown[: self.units.numel()] = self.units.to(device)
            self.units = grown
        return start

    def unit_activity(self) -> list[torch.Tensor | None]:
        """Per key, the fraction of its observed values that were active, per unit (`None` before any)."""
        self.flush()
        out: list[torch.Tensor | None] = []
        for key, slot in enumerate(self.unit_slots):
            if slot is None or self.units is None or self.unit_values[key] <= 0:
                out.append(None)
            else:
                out.append(self.units[slot[0] : slot[0] + slot[1]] / self.unit_values[key])
        return out

    def unit_state(self) -> tuple[list[torch.Tensor | None], list[float]]:
        """Per key, its active counts per unit (on the CPU; `None` before any) and values observed per unit."""
        self.flush()
        counts: list[torch.Tensor | None] = []
        for slot in self.unit_slots:
            found = None if slot is None or self.units is None else self.units[slot[0] : slot[0] + slot[1]].cpu()
            counts.append(None if found is None else found.clone())
        return counts, list(self.unit_values)

    def load_unit_state(self, counts: list[torch.Tensor | None], values: list[float], device: torch.device) -> None:
        """Replace the unit activity by what `unit_state` returned."""
        self.units, self.unit_slots, self.unit_values = None, [None] * self.keys, [float(v) for v in values]
        for key, found in enumerate(counts):
            if found is not None:
                start = self._unit_slot(key, found.numel(), device)
                if self.units is not None and start is not None:
                    self.units[start : start + found.numel()] = found.reshape(-1).to(self.units)

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

    def flush(self) -> None:
        """Write every observation waiting into its cell: a fixed number of torch calls."""
        if not self.is_pending or self.records is None:
            return
        small, large = self._take_pending()
        items: list[torch.Tensor] = []
        base, groups = 0, list[tuple[int, int]]()
        if small:
            base, parts = self._small_parts(small)
            layout = self._layout(parts, self._build)
            items.append(self._describe_small(self._values(small), layout))
            groups = layout.groups
        if large:
            items.append(torch.stack([item for _, _, item in large]))
        unique, segment = self._cells(base, groups, large)
        width = len(RECORD)
        records = self.records.view(-1, width)
        merged_items = torch.cat(items)
        held = records.index_select(0, unique)
        every = torch.cat([merged_items[:, :width], held])
        records.index_copy_(0, unique, combine_segments(every, segment, unique.numel()))
        if self.bins is not None:
            self._flush_hists(merged_items, unique, segment)

    def _describe_small(self, values: torch.Tensor, layout: _RecordLayout) -> torch.Tensor:
        """(groups, width) records (+ histogram and exponent) of the small values; unit activity added."""
        record = describe_segments(values, layout.segments, self.spec)
        parts = [record]
        if self.bins is not None:
            finite = torch.isfinite(values).double()
            seg, groups = layout.segments.segment, layout.segments.groups
            if self.hist_range is not None:
                exponents = torch.full((groups,), EXPONENT_NONE, dtype=torch.int64, device=values.device)
                hist = segment_counts(values, finite, seg, groups, self.bins, None, self.hist_range)
            else:
                largest = torch.maximum(record[:, Column.MIN].abs(), record[:, Column.MAX].abs())
                exponents = exponent_of(torch.where(record[:, Column.COUNT] > 0, largest, 0.0))
                hist = segment_counts(values, finite, seg, groups, self.bins, exponents)
            parts += [hist, exponents[:, None].double()]
        if layout.units is not None and self.units is not None:
            self.units.index_add_(0, layout.units, active(values))
            for key, per_unit in layout.unit_values:
                self.unit_values[key] += per_unit
        self.unit_mismatch += layout.unit_mismatch
        return torch.cat(parts, dim=1)

    def _flush_hists(self, items: torch.Tensor, unique: torch.Tensor, segment: torch.Tensor) -> None:
        if self.hists is None or self.exponents is None:
            return
        bins = self.bins or 0
        width, hist_width = len(RECORD), bins + 2
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

    def _build(self, parts: tuple[Part, ...]) -> _RecordLayout:
        device = self.device or torch.device("cpu")
        return _RecordLayout(parts, self, device)

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
        for name in ("records", "hists", "exponents", "units"):
            tensor = getattr(self, name)
            if tensor is not None:
                setattr(self, name, tensor.to(device))
        self._layouts.clear()


class _RecordLayout:
    """What depends only on the arrangement of the small tensors waiting: groups, cells, unit positions."""

    def __init__(self, parts: tuple[Part, ...], table: RecordTable, device: torch.device) -> None:
        ids: dict[tuple[int, int], int] = {}
        owners = [ids.setdefault((row, key), len(ids)) for row, key, _ in parts]
        bounds = [table.saturation[key] for _, key in ids]
        sizes = [math.prod(shape) for _, _, shape in parts]
        self.segments = Segments(sizes, owners, device, bounds)
        self.groups = list(ids)  # (row relative to the first one waiting, key)
        self.units: torch.Tensor | None = None
        self.unit_values: list[tuple[int, float]] = []
        self.unit_mismatch = 0
        if table.unit_dim is not None:
            self._unit_ids(parts, sizes, table, device)

    def _unit_ids(self, parts: tuple[Part, ...], sizes: list[int], table: RecordTable, device: torch.device) -> None:
        ids = []
        for (_, key, shape), size in zip(parts, sizes, strict=True):
            unit = table.unit_dim(key, len(shape)) if table.unit_dim is not None else None
            start = None if unit is None else table._unit_slot(key, shape[unit], device)
            if unit is None or start is None:
                self.unit_mismatch += unit is not None
                ids.append(np.zeros(size, dtype=np.int64))
                continue
            view = [1] * len(shape)
            view[unit] = shape[unit]
            ids.append(np.broadcast_to(np.arange(start, start + shape[unit]).reshape(view), shape).reshape(-1))
            self.unit_values.append((key, size / shape[unit]))
        if self.unit_values:
            self.units = _to(torch.from_numpy(np.concatenate(ids)), device)


class NormTable(_Table):
    """Norm records (`NORM`: the norm of the finite values, non-finite and value counts, sampled count) per cell.

    Args:
        keys: The number of keys (modules or parameters).
        sampler: Describe large tensors from a sample (`None`: exactly).
    """

    def __init__(self, keys: int, sampler: Sampler | None = None) -> None:
        super().__init__(keys, sampler)
        self.norms: torch.Tensor | None = None  # (rows, keys, len(NORM)) float64

    def add(self, row: int, key: int, x: torch.Tensor, *, owned: bool = False) -> None:
        """Observe `x` in cell (row, key) (complex tensors count |z|)."""
        if x.is_complex():
            x = torch.view_as_real(x.detach())
            owned = False
        if x.numel() == 0:
            return
        if x.numel() < SMALL_BELOW and x.dtype != torch.float64:
            self._keep_small(row, key, x, owned)
        else:
            self._large.append((row, key, norm_of(x.detach(), self.sampler)))

    def add_flat(self, row: int, keys: list[int], shapes: list[tuple[int, ...]], flat: torch.Tensor) -> None:
        """Observe several small tensors of cell row given concatenated in `flat` (a float32 tensor nobody else
        holds: the parameters of an optimizer step in one copy), `keys[i]` of shape `shapes[i]`."""
        self._small.append((row, tuple(zip(keys, shapes, strict=True)), flat))
        self.pending_values += flat.numel()

    def add_record(self, row: int, key: int, norm: torch.Tensor) -> None:
        """Add a norm record made elsewhere (a compiled backward's, for instance) to cell (row, key)."""
        self._large.append((row, key, norm.double()))

    def reset(self, rows: torch.Tensor) -> None:
        """Empty the cells of `rows` (an int64 tensor of rows, on the table's device)."""
        if self.norms is not None:
            self.norms.index_fill_(0, rows, 0.0)

    def flush(self) -> None:
        """Write every observation waiting into its cell: a fixed number of torch calls."""
        if not self.is_pending or self.norms is None:
            return
        small, large = self._take_pending()
        items: list[torch.Tensor] = []
        base, groups = 0, list[tuple[int, int]]()
        if small:
            base, parts = self._small_parts(small)
            segments, groups = self._layout(parts, self._build)
            items.append(norm_segments(self._values(small), segments))
        if large:
            items.append(torch.stack([item for _, _, item in large]))
        unique, segment = self._cells(base, groups, large)
        norms = self.norms.view(-1, len(NORM))
        every = torch.cat([*items, norms.index_select(0, unique)])
        norms.index_copy_(0, unique, combine_norm_segments(every, segment, unique.numel()))

    def _build(self, parts: tuple[Part, ...]) -> tuple[Segments, list[tuple[int, int]]]:
        ids: dict[tuple[int, int], int] = {}
        owners = [ids.setdefault((row, key), len(ids)) for row, key, _ in parts]
        sizes = [math.prod(shape) for _, _, shape in parts]
        return Segments(sizes, owners, self.device or torch.device("cpu")), list(ids)

    def _grow(self, rows: int, device: torch.device) -> None:
        norms = torch.zeros(rows, self.keys, len(NORM), dtype=torch.float64, device=device)
        if self.norms is not None:
            norms[: self.rows] = self.norms
        self.norms = norms

    def _move(self, device: torch.device) -> None:
        if self.norms is not None:
            self.norms = self.norms.to(device)
        self._layouts.clear()


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move a small index tensor built on the host to `device` (pinned and asynchronous on CUDA: no sync)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
