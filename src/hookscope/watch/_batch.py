"""The small tensors of several steps described in one batched pass: a fixed number of torch calls per batch.

On small models the cost of monitoring is the number of torch calls, not the number of values: ~30 per module
per step, a few microseconds each, dwarf the work. Hooks therefore copy each small tensor (fewer than
`BATCH_BELOW` values: activations, output gradients, parameter gradients) into the step's log, and up to
`PENDING_STEPS` closed steps are described together: their tensors are concatenated and every statistic of
every tensor is taken with segment reductions (`index_add_`, `scatter_reduce_`, one `bincount` for all
histograms), written into the steps' rows with one `index_copy_`. Everything that depends only on the
arrangement of the tensors (segment ids, row positions, histogram offsets, unit ids) is built once per
`BatchLayout` and cached, so a steady training loop pays ~30 calls per batch of steps whatever the number of
modules.

Statistics are exact up to float rounding: values are float64 here, the variance is two-pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._buffers import ACTIVATION, OUTPUT_GRAD, PARAM_GRAD, UPDATE, WEIGHT, RowLayout

__all__ = [
    "ACTIVATION",
    "OUTPUT_GRAD",
    "PARAM_GRAD",
    "UPDATE",
    "WEIGHT",
    "BatchLayout",
    "HistState",
    "Part",
    "RowPart",
    "hist_into_row",
    "hist_positions",
    "segment_table",
    "to_device",
]

Part = tuple[int, int, tuple[int, ...]]
"""One tensor of a step: (kind, module or parameter index, shape)."""
RowPart = tuple[int, int, int, tuple[int, ...]]
"""One tensor of a batch of steps: (step's row relative to the batch's first, kind, index, shape)."""

_TABLE = ("mean", "variance", "min", "max", "near_zero", "nonfinite", "saturated", "sum_squares", "count")
_SOURCE = {  # per kind: the table columns written into the row's columns, in row order
    ACTIVATION: (0, 1, 2, 3, 4, 5, 6),
    OUTPUT_GRAD: (7, 5, 8),
    PARAM_GRAD: (7, 5),
    UPDATE: (7,),
    WEIGHT: (7,),
}


@dataclass
class HistState:
    """Per-module histogram scales on the device, `ready[j]` once module `j`'s range is fixed."""

    scale: torch.Tensor  # (modules,) float64
    shift: torch.Tensor  # (modules,) float64
    ready: list[bool]


class BatchLayout:
    """What does not change between batches of steps with the same small tensors (`parts`: activations of every
    step first, in hook order, then gradients), written into consecutive rows.

    Parts of the same step, kind and index (a module called twice) form one group, so their statistics are
    merged by the reductions themselves. Positions are in the flat view of the batch's rows.
    """

    def __init__(
        self,
        parts: tuple[RowPart, ...],
        row: RowLayout,
        device: torch.device,
        bounds: list[tuple[float, float] | None],
    ) -> None:
        self.parts = parts
        self.sizes = [math.prod(shape) for _, _, _, shape in parts]
        ids: dict[tuple[int, int, int], int] = {}
        seg = [ids.setdefault((r, kind, index), len(ids)) for r, kind, index, _ in parts]
        self.groups = list(ids)
        count = [0] * len(ids)
        for g, size in zip(seg, self.sizes, strict=True):
            count[g] += size
        self.activation_sizes = [(r, j, count[g]) for g, (r, kind, j) in enumerate(self.groups) if kind == ACTIVATION]
        self.activation_values = sum(size for _, _, size in self.activation_sizes)  # activations come first
        self.seg = to_device(torch.repeat_interleave(torch.tensor(seg), torch.tensor(self.sizes)), device)
        self.count = to_device(torch.tensor(count, dtype=torch.float64), device)
        self.targets = to_device(_targets(self.groups, row), device)
        bounded = [kind == ACTIVATION and bounds[j] is not None for _, kind, j in self.groups]
        self.saturation = _saturation(parts, self.sizes, bounds, device) if any(bounded) else None
        self.bounded = to_device(torch.tensor(bounded), device)
        rows = 4 if self.saturation is not None else 3
        self.columns = torch.zeros(rows, sum(self.sizes), dtype=torch.float64, device=device)
        self.rows = self.columns.unbind(0)
        self.seg_acts = self.seg[: self.activation_values]
        self.smallest = torch.full((len(ids),), math.nan, dtype=torch.float64, device=device)
        self.largest = torch.full_like(self.smallest, math.nan)
        self.nan = torch.full_like(self.smallest, math.nan)
        self.hist: tuple[torch.Tensor, ...] | None = None  # per value (scale, offset, low, high), see hist_positions
        self.units: torch.Tensor | None = None  # per value, its slot in the unit table (0: no unit)
        self.unit_counts: list[tuple[int, int]] = []  # (module, values per unit) added per step
        self.unit_mismatch = 0  # parts whose unit count differs from the module's first one


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move a small index tensor built on the host to `device` (pinned and asynchronous on CUDA: no sync)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def _targets(groups: list[tuple[int, int, int]], row: RowLayout) -> torch.Tensor:
    """(groups * len(_TABLE),) positions of every table entry in the batch's rows (a dump column when not
    written)."""
    out = []
    for r, kind, index in groups:
        base = r * row.width
        start = base + row.start(kind, index)
        wanted = {column: start + k for k, column in enumerate(_SOURCE[kind])}
        out += [wanted.get(column, base + row.dump) for column in range(len(_TABLE))]
    return torch.tensor(out)


def _saturation(
    parts: tuple[RowPart, ...], sizes: list[int], bounds: list[tuple[float, float] | None], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per value: the middle and the half-width (x 0.98) of its module's output range (NaN where unbounded)."""
    middle, half = [], []
    for (_, kind, index, _), size in zip(parts, sizes, strict=True):
        if kind != ACTIVATION:
            break
        bound = bounds[index]
        low, high = bound if bound is not None else (math.nan, math.nan)
        middle.append(torch.full((size,), (low + high) / 2, dtype=torch.float64))
        half.append(torch.full((size,), 0.49 * (high - low), dtype=torch.float64))
    return to_device(torch.cat(middle), device), to_device(torch.cat(half), device)


def segment_table(values: torch.Tensor, layout: BatchLayout, near_zero: float) -> torch.Tensor:
    """Return the (groups, 9) float64 statistics (`_TABLE`) of each group of `values` (flat float64).

    Activations come first in `values`; only they get a mean (gradients keep mean 0, so their centred sum of
    squares is their plain sum of squares), min and max: scatter calls cost per value, so they see only what
    needs them.
    """
    seg, count, rows, acts = layout.seg, layout.count, layout.rows, layout.activation_values
    head = values[:acts]
    sums = torch.zeros_like(count)
    if acts:
        sums.index_add_(0, layout.seg_acts, head)
    mean = sums / count
    torch.sub(values, mean.index_select(0, seg), out=rows[0]).square_()
    torch.abs(values, out=rows[1]).le_(near_zero)
    torch.mul(values, 0, out=rows[2]).ne_(0)  # NaN exactly where the value is not finite
    saturated = layout.nan
    if layout.saturation is not None:
        middle, half = layout.saturation
        torch.sub(head, middle, out=rows[3][:acts]).abs_().ge_(half)
    totals = torch.zeros(len(rows), len(count), dtype=torch.float64, device=values.device)
    totals.index_add_(1, seg, layout.columns)
    smallest, largest = layout.smallest, layout.largest
    if acts:
        smallest.scatter_reduce_(0, layout.seg_acts, head, "amin", include_self=False)
        largest.scatter_reduce_(0, layout.seg_acts, head, "amax", include_self=False)
    if layout.saturation is not None:
        saturated = torch.where(layout.bounded, totals[3], math.nan)
    # gradients keep mean 0: their centred sum of squares (column 7) is their sum of squares
    table = (mean, totals[0] / count, smallest, largest, totals[1], totals[2], saturated, totals[0], count)
    return torch.stack(table, dim=1)


def hist_positions(layout: BatchLayout, row: RowLayout, state: HistState, bins: int) -> tuple[torch.Tensor, ...]:
    """Per activation value: `(scale, offset, low, high)` such that `clamp(v * scale + offset, low, high)`
    truncates to the position of its bin in the batch's rows."""
    module_of, base = [], []
    for (r, kind, index, _), size in zip(layout.parts, layout.sizes, strict=True):
        if kind != ACTIVATION:
            break
        module_of.append(torch.full((size,), index, dtype=torch.int64))
        base.append(torch.full((size,), r * row.width + row.hist(index), dtype=torch.float64))
    device = state.scale.device
    modules, start = (to_device(torch.cat(t), device) for t in (module_of, base))
    scale, shift = state.scale.index_select(0, modules), state.shift.index_select(0, modules)
    return scale, start + shift, start, start + (bins - 0.5)


def hist_into_row(values: torch.Tensor, positions: tuple[torch.Tensor, ...], row: torch.Tensor, dump: int) -> None:
    """Add the histogram counts of the activation values (a prefix of `values`) into `row` (the flat rows of
    the batch): one `bincount`."""
    scale, offset, low, high = positions
    position = torch.addcmul(offset, values[: scale.numel()], scale).clamp_(low, high).nan_to_num_(nan=dump + 0.5)
    row.add_(torch.bincount(position.to(torch.int32), minlength=row.numel()))
