"""Preallocated device buffers for the recorded steps, flushed to the host in one transfer when full or read.

`StepBuffers` holds one row per recorded step (up to `rows`) for every statistic group; hooks write into a row
with plain tensor copies, and Python-side counters say what each row has seen, so no statistic is read back
until `take()` moves the rows to the CPU as a `Chunk` with the final statistics (`ACTIVATION_STATS`,
`GRAD_STATS`), NaN where nothing was observed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Chunk", "StepBuffers"]


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


class StepBuffers:
    """Device rows for up to `rows` recorded steps of `modules` modules and `params` parameters.

    Rows are a ring addressed by a row id that only grows (`slot = row_id % rows`): hooks keep the id of the row
    they write into and check `is_live(row_id)`, so a row flushed meanwhile is never written again.
    """

    def __init__(self, rows: int, modules: int, params: int, bins: int) -> None:
        self.rows, self.modules, self.params, self.bins = rows, modules, params, bins
        self.first_id = 0  # the oldest row not flushed yet
        self.next_id = 0  # the id the next row gets
        self.steps = [0] * rows
        self.counts = [[0] * modules for _ in range(rows)]  # values observed per (slot, module)
        self.grad_values = [[0] * modules for _ in range(rows)]  # gradient values received per (slot, module)
        self.param_seen = [False] * rows
        self.ratio_seen = [False] * rows
        self.loss_calls = [0] * rows
        self.device: torch.device | None = None
        self.tensors: dict[str, torch.Tensor] = {}
        self._views: list[dict[str, tuple[torch.Tensor, ...]]] = [{} for _ in range(rows)]

    def allocate(self, device: torch.device) -> None:
        """Allocate the device tensors on `device` (once)."""
        if self.device is not None:
            return
        self.device = device
        rows, modules, params = self.rows, self.modules, self.params
        shapes = {
            "activations": (rows, modules, 7),
            "histograms": (rows, modules, self.bins),
            "output_grads": (rows, modules, 2),
            "param_grads": (rows, params, 2),
            "update_ratios": (rows, params),
            "losses": (rows,),
        }
        self.tensors = {name: torch.zeros(shape, device=device) for name, shape in shapes.items()}

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
        self.grad_values[slot] = [0] * self.modules
        self.param_seen[slot] = self.ratio_seen[slot] = False
        self.loss_calls[slot] = 0
        self._views[slot] = {}
        return row_id

    def module_view(self, slot: int, name: str, index: int) -> torch.Tensor:
        """The (columns,) view of module `index` in table `name` at `slot` (views made once per row and table)."""
        views = self._views[slot].get(name)
        if views is None:
            views = self._views[slot][name] = self.tensors[name][slot].unbind(0)
        return views[index]

    def take(self, stop_id: int | None = None) -> Chunk | None:
        """Move rows up to `stop_id` (default: all) to the CPU in one transfer and return them (`None`: empty)."""
        stop = self.next_id if stop_id is None else stop_id
        slots = [row_id % self.rows for row_id in range(self.first_id, stop)]
        if not slots:
            return None
        raw = _to_cpu({name: t[slots] for name, t in self.tensors.items()}) if self.tensors else {}
        chunk = self._finish(raw, slots)
        self.first_id = stop
        return chunk

    def _finish(self, raw: dict[str, torch.Tensor], slots: list[int]) -> Chunk:
        nan, used = math.nan, len(slots)
        counts = torch.tensor([self.counts[s] for s in slots], dtype=torch.float64).reshape(used, self.modules)
        grad_values = torch.tensor([self.grad_values[s] for s in slots], dtype=torch.float64)
        grad_values = grad_values.reshape(used, self.modules)
        param_seen = torch.tensor([self.param_seen[s] for s in slots])
        ratio_seen = torch.tensor([self.ratio_seen[s] for s in slots])
        loss_calls = torch.tensor([self.loss_calls[s] for s in slots], dtype=torch.float32)
        if not raw:
            raw = {
                "activations": torch.full((used, self.modules, 7), nan),
                "histograms": torch.zeros(used, self.modules, self.bins),
                "output_grads": torch.full((used, self.modules, 2), nan),
                "param_grads": torch.full((used, self.params, 2), nan),
                "update_ratios": torch.full((used, self.params), nan),
                "losses": torch.full((used,), nan),
            }
        output_grads = raw["output_grads"]
        return Chunk(
            steps=torch.tensor([self.steps[s] for s in slots], dtype=torch.int64),
            activations=_activation_stats(raw["activations"], counts),
            histograms=torch.where((counts > 0)[..., None], raw["histograms"], 0.0),
            output_grads=torch.where((grad_values > 0)[..., None], output_grads, nan).float(),
            param_grads=torch.where(param_seen[:, None, None], raw["param_grads"], nan),
            update_ratios=torch.where(ratio_seen[:, None], raw["update_ratios"], nan),
            losses=torch.where(loss_calls > 0, raw["losses"] / loss_calls.clamp(min=1), nan),
            has_loss=bool(loss_calls.any()),
        )


def _to_cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copy every tensor to the CPU with one device-to-host transfer."""
    names = list(tensors)
    flat = torch.cat([tensors[name].reshape(-1) for name in names]).cpu()
    out, start = {}, 0
    for name in names:
        size = tensors[name].numel()
        out[name] = flat[start : start + size].reshape(tensors[name].shape)
        start += size
    return out


def _activation_stats(raw: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Turn raw activation vectors (`RAW_ACTIVATION`) and value counts into `ACTIVATION_STATS` (float32)."""
    raw = raw.double()
    mean, variance, smallest, largest, near, nonfinite, saturated = raw.unbind(-1)
    n = counts.clamp(min=1)
    std = (variance * counts / (counts - 1).clamp(min=1)).sqrt()
    rms = (variance + mean * mean).sqrt()
    stats = torch.stack((mean, std, rms, smallest, largest, near / n, nonfinite, saturated / n, counts), dim=-1)
    return torch.where((counts > 0)[..., None], stats, math.nan).float()
