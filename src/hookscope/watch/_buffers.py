"""Preallocated device rows for the recorded steps, flushed to the host in one transfer when full or read.

`StepBuffers` holds one flat row per recorded step (up to `rows`), laid out by `RowLayout`: every statistic of
every module and parameter has a fixed column, so a step's results are written with a handful of `index_copy_`
/ `index_add_` calls and a whole chunk of steps moves to the CPU with one copy. Python-side counters say what
each row has seen; `take()` turns rows into a `Chunk` with the final statistics (`ACTIVATION_STATS`,
`GRAD_STATS`), NaN where nothing was observed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["ACTIVATION", "OUTPUT_GRAD", "PARAM_GRAD", "UPDATE", "WEIGHT", "Chunk", "RowLayout", "StepBuffers"]

ACTIVATION, OUTPUT_GRAD, PARAM_GRAD, UPDATE, WEIGHT = 0, 1, 2, 3, 4
"""Kinds of recorded tensors (activation of a module, gradient of its output, gradient of a parameter, change of
a parameter in an optimizer step, the parameter after it)."""


@dataclass
class Chunk:
    """Recorded steps on the CPU: every table has one row per step, NaN where nothing was observed.

    Shapes: steps (S,); activations (S, modules, len(ACTIVATION_STATS)); histograms (S, modules, bins);
    output_grads (S, modules, 2); param_grads (S, params, 2); update_ratios (S, params); losses (S,).
    """

    steps: torch.Tensor
    activations: torch.Tensor
    histograms: torch.Tensor
    output_grads: torch.Tensor
    param_grads: torch.Tensor
    update_ratios: torch.Tensor
    losses: torch.Tensor
    has_loss: bool = False

    def select(self, keep: torch.Tensor) -> Chunk:
        """Return the rows where the boolean mask `keep` is true."""
        tables = {name: getattr(self, name)[keep] for name in _TABLES}
        return Chunk(**tables, has_loss=self.has_loss)

    @staticmethod
    def concat(chunks: list[Chunk]) -> Chunk:
        """Stack chunks along the step dimension (at least one chunk)."""
        tables = {name: torch.cat([getattr(c, name) for c in chunks]) for name in _TABLES}
        return Chunk(**tables, has_loss=any(c.has_loss for c in chunks))

    def __len__(self) -> int:
        return int(self.steps.numel())


_TABLES = ("steps", "activations", "histograms", "output_grads", "param_grads", "update_ratios", "losses")


class RowLayout:
    """Columns of one step's row: per module 7 raw activation statistics (`RAW_ACTIVATION`), `bins` histogram
    counts and 3 output-gradient columns (sum of squares, non-finite count, value count); per parameter 2
    gradient columns (sum of squares, non-finite count) and 2 update columns (sums of squares of the change in
    an optimizer step and of the weight after it: their ratio's root is the update ratio); the loss; a dump
    column that absorbs writes with nowhere to go."""

    def __init__(self, modules: int, params: int, bins: int) -> None:
        self.modules, self.params, self.bins = modules, params, bins
        self.hist_at = modules * 7
        self.grad_at = self.hist_at + modules * bins
        self.param_at = self.grad_at + modules * 3
        self.ratio_at = self.param_at + params * 2
        self.loss_at = self.ratio_at + params * 2
        self.dump = self.loss_at + 1
        self.width = self.dump + 1

    def start(self, kind: int, index: int) -> int:
        """The first column of the statistics of `kind` (`ACTIVATION` ...) for module or parameter `index`."""
        if kind == ACTIVATION:
            return index * 7
        if kind == OUTPUT_GRAD:
            return self.grad_at + index * 3
        if kind == PARAM_GRAD:
            return self.param_at + index * 2
        return self.ratio_at + index * 2 + (kind == WEIGHT)

    def hist(self, index: int) -> int:
        """The first histogram column of module `index`."""
        return self.hist_at + index * self.bins

    def split(self, table: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of a (rows, width) table: activations (rows, modules, 7), histograms, output_grads (rows,
        modules, 3), param_grads (rows, params, 2), update_ratios (rows, params, 2: change and weight sums of
        squares), losses."""
        m, p, bins, rows = self.modules, self.params, self.bins, table.shape[0]
        return {
            "activations": table[:, : self.hist_at].view(rows, m, 7),
            "histograms": table[:, self.hist_at : self.grad_at].view(rows, m, bins),
            "output_grads": table[:, self.grad_at : self.param_at].view(rows, m, 3),
            "param_grads": table[:, self.param_at : self.ratio_at].view(rows, p, 2),
            "update_ratios": table[:, self.ratio_at : self.loss_at].view(rows, p, 2),
            "losses": table[:, self.loss_at],
        }


class StepBuffers:
    """Device rows for up to `rows` recorded steps of `modules` modules and `params` parameters.

    Rows are a ring addressed by a row id that only grows (`slot = row_id % rows`): writers keep the id of the
    row they write into and check `is_live(row_id)`, so a row flushed meanwhile is never written again. A new
    row starts at zero (histograms and gradient sums accumulate into it).
    """

    def __init__(self, rows: int, modules: int, params: int, bins: int) -> None:
        self.rows, self.modules, self.params, self.bins = rows, modules, params, bins
        self.layout = RowLayout(modules, params, bins)
        self.first_id = 0  # the oldest row not flushed yet
        self.next_id = 0  # the id the next row gets
        self.steps = [0] * rows
        self.counts = [[0] * modules for _ in range(rows)]  # activation values observed per (slot, module)
        self.param_seen = [False] * rows
        self.ratio_seen = [False] * rows
        self.loss_calls = [0] * rows
        self.device: torch.device | None = None
        self.table: torch.Tensor | None = None  # (rows, layout.width) float32

    def allocate(self, device: torch.device) -> torch.Tensor:
        """Allocate the device rows on `device` (once) and return the (rows, width) table."""
        if self.table is None:
            self.device = device
            self.table = torch.zeros(self.rows, self.layout.width, device=device)
        return self.table

    def row(self, row_id: int, device: torch.device) -> torch.Tensor:
        """The (width,) row of `row_id` (allocated on `device` when nothing is yet)."""
        return self.allocate(device)[row_id % self.rows]

    @property
    def is_full(self) -> bool:
        """Whether every row is taken."""
        return self.next_id - self.first_id >= self.rows

    def is_live(self, row_id: int) -> bool:
        """Whether row `row_id` is still in the buffers (not flushed)."""
        return self.first_id <= row_id < self.next_id

    def new_row(self, step: int) -> int:
        """Open a row for `step` and return its id (the caller flushes first when full)."""
        row_id = self.next_id
        slot = row_id % self.rows
        self.next_id += 1
        self.steps[slot] = step
        self.counts[slot] = [0] * self.modules
        self.param_seen[slot] = self.ratio_seen[slot] = False
        self.loss_calls[slot] = 0
        if self.table is not None:
            self.table[slot].zero_()
        return row_id

    def take(self, stop_id: int | None = None) -> Chunk | None:
        """Move rows up to `stop_id` (default: all) to the CPU in one transfer and return them (`None`: empty)."""
        stop = self.next_id if stop_id is None else stop_id
        slots = [row_id % self.rows for row_id in range(self.first_id, stop)]
        if not slots:
            return None
        raw = torch.zeros(len(slots), self.layout.width) if self.table is None else self.table[slots].cpu()
        chunk = self._finish(self.layout.split(raw), slots)
        self.first_id = stop
        return chunk

    def _finish(self, raw: dict[str, torch.Tensor], slots: list[int]) -> Chunk:
        nan, used = math.nan, len(slots)
        counts = torch.tensor([self.counts[s] for s in slots], dtype=torch.float64).reshape(used, self.modules)
        param_seen = torch.tensor([self.param_seen[s] for s in slots])
        ratio_seen = torch.tensor([self.ratio_seen[s] for s in slots])
        loss_calls = torch.tensor([self.loss_calls[s] for s in slots], dtype=torch.float32)
        return Chunk(
            steps=torch.tensor([self.steps[s] for s in slots], dtype=torch.int64),
            activations=_activation_stats(raw["activations"], counts),
            histograms=torch.where((counts > 0)[..., None], raw["histograms"], 0.0),
            output_grads=_grad_stats(raw["output_grads"][..., :2], raw["output_grads"][..., 2] > 0),
            param_grads=_grad_stats(raw["param_grads"], param_seen[:, None].expand(used, self.params)),
            update_ratios=torch.where(ratio_seen[:, None], _ratios(raw["update_ratios"]), nan),
            losses=torch.where(loss_calls > 0, raw["losses"] / loss_calls.clamp(min=1), nan),
            has_loss=bool(loss_calls.any()),
        )


def _ratios(raw: torch.Tensor) -> torch.Tensor:
    """(change, weight) sums of squares -> ||W_after - W_before|| / ||W_after||."""
    squares = raw.double()
    return (squares[..., 0] / squares[..., 1]).sqrt().float()


def _grad_stats(raw: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """(sum of squares, non-finite count) -> (L2 norm, non-finite count), NaN where not `seen`."""
    stats = torch.stack((raw[..., 0].double().sqrt().float(), raw[..., 1]), dim=-1)
    return torch.where(seen[..., None], stats, math.nan)


def _activation_stats(raw: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Turn raw activation vectors (`RAW_ACTIVATION`) and value counts into `ACTIVATION_STATS` (float32)."""
    raw = raw.double()
    mean, variance, smallest, largest, near, nonfinite, saturated = raw.unbind(-1)
    n = counts.clamp(min=1)
    std = (variance * counts / (counts - 1).clamp(min=1)).sqrt()
    rms = (variance + mean * mean).sqrt()
    stats = torch.stack((mean, std, rms, smallest, largest, near / n, nonfinite, saturated / n, counts), dim=-1)
    return torch.where((counts > 0)[..., None], stats, math.nan).float()
