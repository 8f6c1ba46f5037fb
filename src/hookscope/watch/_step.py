"""Writing recorded steps into their rows: the steps' logs, the batched pass, the per-module tables it updates.

`StepLog` is what the hooks of one step leave behind (copies of small tensors, statistics of large ones). A
closed step's log waits (`defer`) until `PENDING_STEPS` logs or `PENDING_VALUES` small values are pending, or
the rows are read; `write_pending` then writes them all into their rows with a fixed number of torch calls: one
batched pass over the small tensors of every pending step (`_batch.py`), one `index_copy_` / `index_add_` per
group of large ones. Index tensors and layouts are cached per arrangement, so steady training builds nothing
per step. Histogram ranges live here too (`HistState`) and the unit activity counts it updates (`_units.py`), on
the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ._batch import BatchLayout, HistState, Part, RowPart, hist_into_row, hist_positions, segment_table, to_device
from ._buffers import ACTIVATION, OUTPUT_GRAD, PARAM_GRAD, StepBuffers
from ._kernels import grad_vector, merge_activation, scale_from_bound, unit_dims
from ._options import WatchOptions
from ._units import UnitTable

__all__ = ["StepLog", "StepWriter"]

_CACHE = 64  # layouts and index tensors kept per watch (cleared beyond; a steady loop needs a handful)
PENDING_STEPS = 32
"""Closed recorded steps whose small tensors wait to be described together."""
PENDING_VALUES = 1 << 20
"""Small values (float32, 4 MiB) that make the pending steps be written at once."""

LargeActivation = tuple[int, int, torch.Tensor, torch.Tensor | None]  # (module, values, vector, histogram)
_KINDS = (ACTIVATION, OUTPUT_GRAD, PARAM_GRAD)


@dataclass(eq=False)
class StepLog:
    """What the hooks of one recorded step left for `write_step`.

    Small tensors are kept per kind (activations, output gradients, parameter gradients) as `SmallEntry`s.
    """

    row: int
    small: tuple[list[SmallEntry], list[SmallEntry], list[SmallEntry]] = field(default_factory=lambda: ([], [], []))
    acts: list[LargeActivation] = field(default_factory=list)
    grads: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (module, grad_vector)
    params: ParamGrads | None = None
    settled: bool = False
    traced: bool = False  # compiled forwards ran: their output gradients are in the stage tensor
    grad_factor: torch.Tensor | None = None  # 1 / loss scale**2 of the step's backward (GradScaler), on the device
    stage: torch.Tensor | None = None  # output-gradient sums of compiled backwards, taken when the step closed
    written: bool = False  # in its row: a gradient arriving now is late
    ratios: list[tuple[torch.Tensor, tuple[Part, ...]]] | None = None  # small parameters' change and weight
    values: int = 0  # small values kept (what the pending steps hold)


ParamGrads = tuple[torch.Tensor | None, tuple[Part, ...], list[tuple[int, torch.Tensor]], list[int]]
"""`(flat, parts, large, missing)`: the small gradients concatenated (float32) and what they are, `(index,
grad_vector)` of the large ones, the parameters without a gradient."""

SmallEntry = tuple[int, tuple[int, ...], torch.Tensor, torch.Tensor | None, int]
"""`(index, shape, tensor, source, version)`: `tensor` (float32) is either the hooked tensor itself (`source`
`None`), trusted because no in-place op changed it after its hook in an earlier step, and checked again by its
version counter, or a copy of `source` (whose version is checked to learn whether the copy can be skipped
later), or an owned copy (`source` `None`, `version` -1)."""


class StepWriter:
    """The device-side tables of a recorder and `write_step`; `Recorder` adds the hooks."""

    bounds: list[tuple[float, float] | None]
    unit_values: list[int]
    dropped: dict[str, int]
    stage: torch.Tensor | None

    def __init__(self, options: WatchOptions, buffers: StepBuffers) -> None:
        self.options = options
        self.buffers = buffers
        self.log: StepLog | None = None
        self.referenced: set[tuple[int, int]] = set()  # (kind, index) whose small tensors are kept uncopied
        self.unit_table = UnitTable(buffers.modules)
        self._hist_state: HistState | None = None
        self._layouts: dict[tuple[RowPart, ...], BatchLayout] = {}
        self.pending: list[StepLog] = []  # closed steps not written yet (consecutive rows)
        self._pending_values = 0
        self._positions: dict[tuple[torch.device, tuple[int, ...]], torch.Tensor] = {}

    def drop(self, reason: str, count: int = 1) -> None:
        """Count `count` observations not kept, by reason."""
        raise NotImplementedError

    def modules(self) -> list[nn.Module | None]:
        """The watched modules (`None` for those deleted)."""
        raise NotImplementedError

    def begin(self, row: int) -> None:
        """Start the log of a recorded step whose row is `row`."""
        self.log = StepLog(row)

    def forget_layouts(self) -> None:
        """Drop the cached layouts and index tensors (modules or devices changed)."""
        self._layouts.clear()
        self._positions.clear()

    # ---- device-side tables (`scales` and `units` are what state dicts and results read) ---------------------
    def hist_state(self, device: torch.device) -> HistState:
        """The histogram ranges of every module on `device` (fixed ranges are ready from the start)."""
        state = self._hist_state
        if state is None or state.scale.device != device:
            state = self._hist_state = _new_hist_state(self.buffers.modules, device, self.options, state)
        return state

    @property
    def scales(self) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """Per module, its histogram `(scale, shift)` (0-d device tensors), `None` before its first record."""
        state = self._hist_state
        if state is None:
            return [None] * self.buffers.modules
        return [(state.scale[j], state.shift[j]) if state.ready[j] else None for j in range(self.buffers.modules)]

    @scales.setter
    def scales(self, values: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        present = [v for v in values if v is not None]
        device = present[0][0].device if present else torch.device("cpu")
        state = self._hist_state = _new_hist_state(self.buffers.modules, device, self.options, None)
        for j, value in enumerate(values):
            if value is not None:
                state.scale[j], state.shift[j] = value[0].to(device), value[1].to(device)
                state.ready[j] = True
        self.forget_layouts()

    @property
    def units(self) -> list[torch.Tensor | None]:
        """Per module, the number of values > 0 per unit over the recorded steps (`None` before any)."""
        return self.unit_table.views()

    @units.setter
    def units(self, values: list[torch.Tensor | None]) -> None:
        self.unit_table.load(values)
        self.forget_layouts()

    def positions(self, columns: list[int], device: torch.device) -> torch.Tensor:
        """A cached int64 device tensor of `columns`."""
        key = (device, tuple(columns))
        tensor = self._positions.get(key)
        if tensor is None:
            if len(self._positions) >= 4 * _CACHE:
                self._positions.clear()
            tensor = self._positions[key] = to_device(torch.tensor(columns, dtype=torch.int64), device)
        return tensor

    # ---- writing a step --------------------------------------------------------------------------------------
    def late_gradient(self, log: StepLog, index: int, grad: torch.Tensor) -> None:
        """Add a gradient that arrived after its step was written, if its row is still on the device."""
        if not self.buffers.is_live(log.row):
            self.drop("late_gradient")
            return
        start = self.buffers.layout.start(OUTPUT_GRAD, index)
        vector = grad_vector(grad.detach())
        if log.grad_factor is not None:
            vector[0] *= log.grad_factor.to(vector.device)
        self.buffers.row(log.row, grad.device)[start : start + 3].add_(vector)

    def defer(self, log: StepLog) -> None:
        """Close `log`: it waits with the other pending steps (written at once when enough are pending)."""
        log.settled = True
        if self.log is log:
            self.log = None
        if log.traced and self.stage is not None:  # the stage is reused by the next step: take it now
            log.stage = self.stage[:, :3].clone()
            self.stage[:, :3].zero_()
        last = self.pending[-1].row if self.pending else None
        if last is not None and (log.row != last + 1 or log.row % self.buffers.rows == 0):  # rows: one block
            self.write_pending()
        self.pending.append(log)
        self._pending_values += log.values
        if len(self.pending) >= PENDING_STEPS or self._pending_values >= PENDING_VALUES:
            self.write_pending()

    def write_pending(self) -> None:
        """Write every pending step into its row: one batched pass over all their small tensors."""
        logs = [log for log in self.pending if self.buffers.is_live(log.row)]
        self.pending, self._pending_values = [], 0
        for log in logs:
            log.written = True
        device = next((d for d in (_device_of_log(log) for log in logs) if d is not None), None)
        if device is None:
            return
        first = logs[0].row % self.buffers.rows
        block = self.buffers.allocate(device)[first : first + len(logs)]
        slots = [log.row % self.buffers.rows for log in logs]
        written: list[set[int]] = [set() for _ in logs]
        tensors, parts = self._small_values(logs)
        if tensors:
            self._write_small(tensors, parts, block.view(-1), slots, written)
        layout = self.buffers.layout
        for r, log in enumerate(logs):
            row, counts = block[r], self.buffers.counts[slots[r]]
            if log.acts:
                self._write_large(log.acts, row, counts, written[r])
            if log.grads:
                columns = [layout.start(OUTPUT_GRAD, j) + k for j, _ in log.grads for k in range(3)]
                row.index_add_(0, self.positions(columns, device), torch.stack([v for _, v in log.grads]).view(-1))
            if log.params is not None:
                self._write_params(row, log.params[2], log.params[3])
            if log.stage is not None:
                row[layout.grad_at : layout.param_at].view(-1, 3).add_(log.stage.to(row.device))
            if log.grad_factor is not None:  # the output gradients were of the scaled loss (GradScaler)
                row[layout.grad_at : layout.param_at].view(-1, 3)[:, 0].mul_(log.grad_factor.to(row))

    def _small_values(self, logs: list[StepLog]) -> tuple[list[torch.Tensor], tuple[RowPart, ...]]:
        """The small tensors of `logs`, activations of every step first, and what they are; kept references are
        checked here: one changed in place since its hook is dropped (and copied from now on), one unchanged is
        trusted."""
        tensors: list[torch.Tensor] = []
        parts: list[RowPart] = []
        for kind in _KINDS:
            for r, log in enumerate(logs):
                for index, shape, tensor, source, version in log.small[kind]:
                    if source is not None:  # a copy: was the original changed after the hook?
                        changed = source._version != version
                        (self.referenced.discard if changed else self.referenced.add)((kind, index))
                    elif version >= 0 and tensor._version != version:
                        self.referenced.discard((kind, index))
                        self.drop("changed_in_place")
                        continue
                    tensors.append(tensor)
                    parts.append((r, kind, index, shape))
        for r, log in enumerate(logs):
            if log.params is not None and log.params[0] is not None:
                tensors.append(log.params[0])
                parts += [(r, *part) for part in log.params[1]]
            for tensor, described in log.ratios or ():
                tensors.append(tensor)
                parts += [(r, *part) for part in described]
        return tensors, tuple(parts)

    def keep_small(self, log: StepLog, kind: int, index: int, tensor: torch.Tensor) -> None:
        """Keep a small tensor of the step: the tensor itself when trusted, else a float32 copy."""
        if tensor.dtype != torch.float32:
            self.keep_owned(log, kind, index, tensor.float())
            return
        log.values += tensor.numel()
        if (kind, index) in self.referenced:
            log.small[kind].append((index, tensor.shape, tensor, None, tensor._version))
        else:
            log.small[kind].append((index, tensor.shape, tensor.clone(), tensor, tensor._version))

    def keep_owned(self, log: StepLog, kind: int, index: int, tensor: torch.Tensor) -> None:
        """Keep a small float32 tensor that only the log holds (a copy made for it)."""
        log.small[kind].append((index, tensor.shape, tensor, None, -1))
        log.values += tensor.numel()

    def _write_small(
        self,
        tensors: list[torch.Tensor],
        parts: tuple[RowPart, ...],
        flat: torch.Tensor,
        slots: list[int],
        written: list[set[int]],
    ) -> None:
        values = torch._C._nn.flatten_dense_tensors(tensors).to(torch.float64)  # a new tensor
        layout = self._layout(parts, values.device)
        table = segment_table(values, layout, self.options.near_zero)
        flat.index_copy_(0, layout.targets, table.view(-1).to(flat.dtype))
        for r, index, size in layout.activation_sizes:
            self.buffers.counts[slots[r]][index] += size
            written[r].add(index)
        if not layout.activation_sizes:
            return
        groups = self.options.groups
        if "histograms" in groups:
            hist_into_row(values, self._hist_positions(layout, table), flat, self.buffers.layout.dump)
        if "unit_activity" in groups:
            self._small_units(layout, values)

    def _layout(self, parts: tuple[RowPart, ...], device: torch.device) -> BatchLayout:
        layout = self._layouts.get(parts)
        if layout is None:
            if len(self._layouts) >= _CACHE:
                self._layouts.clear()
            layout = self._layouts[parts] = BatchLayout(parts, self.buffers.layout, device, self.bounds)
        return layout

    def _hist_positions(self, layout: BatchLayout, table: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if layout.hist is None:
            state = self.hist_state(table.device)
            first: dict[int, int] = {}  # module without a range -> its first group (its first recorded step)
            for g, (_, kind, j) in enumerate(layout.groups):
                if kind == ACTIVATION and not state.ready[j]:
                    first.setdefault(j, g)
            missing = [(g, j) for j, g in first.items()]
            if missing:
                rows = self.positions([g for g, _ in missing], table.device)
                chosen = table.index_select(0, rows)
                scale, shift = scale_from_bound(torch.maximum(-chosen[:, 2], chosen[:, 3]), self.options.hist_bins)
                targets = self.positions([j for _, j in missing], table.device)
                state.scale.index_copy_(0, targets, scale)
                state.shift.index_copy_(0, targets, shift)
                for _, j in missing:
                    state.ready[j] = True
            layout.hist = hist_positions(layout, self.buffers.layout, state, self.options.hist_bins)
        return layout.hist

    def _small_units(self, layout: BatchLayout, values: torch.Tensor) -> None:
        if layout.units is None:
            self._build_units(layout, values.device)
        table = self.unit_table.flat
        if layout.units is None or table is None:
            return
        active = torch.gt(values[: layout.activation_values], 0, out=layout.rows[0][: layout.activation_values])
        table.index_add_(0, layout.units, active if active.dtype == table.dtype else active.to(table.dtype))
        for index, per_unit in layout.unit_counts:
            self.unit_values[index] += per_unit
        if layout.unit_mismatch:
            self.drop("unit_shape", layout.unit_mismatch)

    def _build_units(self, layout: BatchLayout, device: torch.device) -> None:
        modules, ids, counts, mismatch = self.modules(), [], [], 0
        for (_, kind, index, shape), size in zip(layout.parts, layout.sizes, strict=True):
            if kind != ACTIVATION:  # activations come first
                break
            module = modules[index]
            dims = None if module is None else unit_dims(module, len(shape))
            start = None if dims is None else self.unit_table.slot(index, shape[dims[0]], device)
            if dims is None or start is None:
                mismatch += dims is not None
                ids.append(torch.zeros(size, dtype=torch.int64))
                continue
            unit, view = dims[0], [1] * len(shape)
            view[unit] = shape[unit]
            ids.append(torch.arange(start, start + shape[unit]).view(view).expand(shape).reshape(-1))
            counts.append((index, size // shape[unit]))
        if counts:
            layout.units = torch.cat(ids).to(device)
        layout.unit_counts, layout.unit_mismatch = counts, mismatch

    def _write_large(
        self, acts: list[LargeActivation], row: torch.Tensor, counts: list[int], written: set[int]
    ) -> None:
        first: list[LargeActivation] = []
        later: list[LargeActivation] = []
        for entry in acts:
            (later if entry[0] in written else first).append(entry)
            written.add(entry[0])
        device, bins = row.device, self.options.hist_bins
        if first:
            columns = [j * 7 + k for j, _, _, _ in first for k in range(7)]
            row.index_copy_(0, self.positions(columns, device), torch.stack([e[2] for e in first]).view(-1))
            hists = [(j, h) for j, _, _, h in first if h is not None]
            if hists:
                columns = [self.buffers.layout.hist(j) + k for j, _ in hists for k in range(bins)]
                row.index_add_(0, self.positions(columns, device), torch.stack([h for _, h in hists]).view(-1))
            for j, n, _, _ in first:
                counts[j] += n
        for j, n, vector, hist in later:  # a module seen again in this step: merge (Chan)
            merge_activation(row[j * 7 : j * 7 + 7], vector, counts[j], n)
            if hist is not None:
                start = self.buffers.layout.hist(j)
                row[start : start + bins].add_(hist)
            counts[j] += n

    def _write_params(self, row: torch.Tensor, large: list[tuple[int, torch.Tensor]], missing: list[int]) -> None:
        layout = self.buffers.layout
        if large:
            columns = [layout.start(PARAM_GRAD, i) + k for i, _ in large for k in range(2)]
            row.index_copy_(0, self.positions(columns, row.device), torch.stack([v[:2] for _, v in large]).view(-1))
        if missing:
            columns = [layout.start(PARAM_GRAD, i) + k for i in missing for k in range(2)]
            row.index_fill_(0, self.positions(columns, row.device), math.nan)


def _new_hist_state(modules: int, device: torch.device, options: WatchOptions, old: HistState | None) -> HistState:
    scale = torch.ones(modules, dtype=torch.float64, device=device)
    shift = torch.zeros(modules, dtype=torch.float64, device=device)
    ready = [False] * modules
    if options.hist_range is not None:
        low, high = options.hist_range
        scale.fill_(options.hist_bins / (high - low))
        shift.fill_(-low * options.hist_bins / (high - low))
        ready = [True] * modules
    elif old is not None:
        scale.copy_(old.scale)
        shift.copy_(old.shift)
        ready = list(old.ready)
    return HistState(scale, shift, ready)


def _device_of_log(log: StepLog) -> torch.device | None:
    for tensors in ([e[2] for e in log.small[0] + log.small[1] + log.small[2]], [a[2] for a in log.acts]):
        if tensors:
            return tensors[0].device
    if log.grads:
        return log.grads[0][1].device
    if log.params is not None:
        flat, _, large, _ = log.params
        if flat is not None or large:
            return flat.device if flat is not None else large[0][1].device
    if log.ratios:
        return log.ratios[0][0].device
    return log.stage.device if log.stage is not None else None
