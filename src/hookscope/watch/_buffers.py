"""Device rows for the recorded steps, moved to the host in one transfer per table when full or read.

Before: the hooks (`_recorder.py`, `_params.py`) add observations to the tables of the open step's row
(`hookscope.stats._tables`). After: `take()` hands the rows, finalized, to the stepper, which keeps them in
`_store.py`; `_assemble.py` turns them into `WatchResults`.

`StepBuffers` holds a ring of `rows` slots, one per recorded step, in the engine's tables (`hookscope.stats`): a
`RecordTable` of activations (a moments record, a histogram and its range per module, and unit activity), a
`NormTable` of output gradients per module, one of parameter gradients and one of updates and weights per parameter
(their norms give the update ratio), and the loss. Hooks add observations to the open step's slot; the tables write
them in batches: once `PENDING_STEPS` recorded steps have closed (`close_step`) or `PENDING_VALUES` small values
wait, and before the rows are taken. `take()` moves the rows to the CPU as a `Chunk` of final statistics
(`STATISTICS`, `GRAD_STATS`), NaN where nothing was observed. Beside them: the per-head attention statistics
(`_attention.py`'s `AttentionTable`), the repeated blocks' residual stream (`_residual.py`'s `ResidualTable`) and,
per parameter, the optimizer's learning rate and epsilon of the step (host values, read from its param groups),
which turn the gradient and update norms into the `OPTIMIZER_STATS` (RMS against epsilon, update RMS / lr, and the
learning rate itself).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..results._results import OPTIMIZER_STATS
from ..stats._norms import NORM, ratio_of_norms
from ..stats._record import STATISTICS, finalize
from ..stats._sample import Sampler
from ..stats._spec import Spec
from ..stats._tables import NormTable, RecordTable
from ._attention import AttentionTable
from ._options import WatchOptions
from ._residual import ResidualTable

__all__ = ["PENDING_STEPS", "PENDING_VALUES", "Chunk", "StepBuffers"]

PENDING_STEPS = 32
"""Closed recorded steps whose small tensors wait to be described together."""
PENDING_VALUES = 1 << 20
"""Small values waiting (float32, 4 MiB) that make the tables write them at once."""


@dataclass
class Chunk:
    """Recorded steps on the CPU: every table has one row per step, NaN where nothing was observed.

    Shapes: steps (S,) int64; activations (S, modules, len(STATISTICS)); histograms (S, modules, bins + 2) counts
    (bins, then below and above a fixed range) on each row's own range; exponents (S, modules) int64, the
    automatic range of each row; output_grads (S, modules, 2) and param_grads (S, params, 2) (norm, non-finite
    count); update_ratios (S, params); losses (S,), NaN where none was logged; loss_counts (S,), how many losses
    were logged in each step (0: the loss is unknown, not non-finite). Floats are float64.
    """

    steps: torch.Tensor
    activations: torch.Tensor
    histograms: torch.Tensor
    exponents: torch.Tensor
    output_grads: torch.Tensor
    param_grads: torch.Tensor
    update_ratios: torch.Tensor
    losses: torch.Tensor
    loss_counts: torch.Tensor
    residual: torch.Tensor
    optimizer: torch.Tensor
    attention: dict[str, torch.Tensor] = field(default_factory=dict)
    has_loss: bool = False

    def select(self, keep: torch.Tensor) -> Chunk:
        """Return the rows where the boolean mask `keep` is true."""
        tables = {name: getattr(self, name)[keep] for name in TABLES}
        attention = {path: values[keep] for path, values in self.attention.items()}
        return Chunk(**tables, attention=attention, has_loss=self.has_loss)

    @staticmethod
    def concat(chunks: list[Chunk]) -> Chunk:
        """Stack chunks along the step dimension (at least one chunk); attention modules a chunk lacks are NaN."""
        tables = {name: torch.cat([getattr(c, name) for c in chunks]) for name in TABLES}
        heads = {path: values.shape[1:] for c in chunks for path, values in c.attention.items()}
        attention = {path: torch.cat([_attention_of(c, path, shape) for c in chunks]) for path, shape in heads.items()}
        return Chunk(**tables, attention=attention, has_loss=any(c.has_loss for c in chunks))

    def __len__(self) -> int:
        return int(self.steps.numel())


def _attention_of(chunk: Chunk, path: str, shape: torch.Size) -> torch.Tensor:
    """`chunk`'s attention rows of `path`, NaN when it has none."""
    found = chunk.attention.get(path)
    return found if found is not None else torch.full((len(chunk), *shape), math.nan, dtype=torch.float64)


TABLES = (
    "steps",
    "activations",
    "histograms",
    "exponents",
    "output_grads",
    "param_grads",
    "update_ratios",
    "losses",
    "loss_counts",
    "residual",
    "optimizer",
)


class StepBuffers:
    """Device rows for up to `rows` recorded steps of `modules` modules and `params` parameters.

    Rows are a ring addressed by a row id that only grows (`slot = row_id % rows`): writers keep the id of the
    row they write into and check `is_live(row_id)`, so a row moved to the host meanwhile is never written again.
    Rows are emptied when they are taken, so a new row starts empty.

    Args:
        options: The watch's options (groups, bins, range, near-zero threshold, sampling).
        modules: The number of watched modules.
        params: The number of watched parameters.
        saturation: Per module, the bounds of a saturating module or `None`.
        unit_dim: `(module, ndim) -> unit dim or None` for unit activity.
        blocks: The number of repeated blocks whose residual stream is recorded.
        param_sizes: The number of values of each watched parameter.
    """

    def __init__(
        self,
        options: WatchOptions,
        modules: int,
        params: int,
        saturation: list[tuple[float, float] | None],
        unit_dim: Callable[[int, int], int | None] | None,
        blocks: int = 0,
        param_sizes: list[int] | None = None,
    ) -> None:
        self.rows, self.modules, self.params = options.buffer_steps, modules, params
        sampler = None if options.exact else Sampler()
        groups = options.groups
        self.acts = RecordTable(
            modules,
            Spec(near_zero=options.near_zero),
            bins=options.hist_bins if "histograms" in groups else None,
            hist_range=options.hist_range,
            saturation=saturation,
            sampler=sampler,
            unit_dim=unit_dim if "unit_activity" in groups else None,
        )
        # gradients (of outputs, of parameters): whether one holds a non-finite value is read exactly (an
        # exploding gradient's float32 sum of squares overflows while every value is finite)
        self.grads = NormTable(modules, sampler)
        self.param_grads = NormTable(params, sampler)
        # the change of parameter p at key p, its weight at params + p: only their norms are read
        self.updates = NormTable(2 * params, sampler, count_nonfinite=False)
        self.tables = (self.acts, self.grads, self.param_grads, self.updates)
        self.attention = AttentionTable(self.rows)
        self.residual = ResidualTable(self.rows, blocks)
        self.param_sizes = torch.tensor(param_sizes or [0] * params, dtype=torch.float64)
        self.settings: list[torch.Tensor | None] = [None] * self.rows  # (params, 2) lr and eps of the row's step
        self.bins = options.hist_bins
        self.first_id = 0  # the oldest row not taken yet
        self.closed = 0  # recorded steps closed since the tables were last written
        self.next_id = 0  # the id the next row gets
        self.steps = [0] * self.rows
        self.loss_calls = [0] * self.rows
        self.grad_factors: list[torch.Tensor | None] = [None] * self.rows  # 1 / loss scale of the row's backward
        self.losses: torch.Tensor | None = None
        self.device: torch.device | None = None

    def allocate(self, device: torch.device) -> None:
        """Allocate the rows on `device` (once)."""
        if self.device is None:
            self.device = device
            for table in self.tables:
                table.allocate(self.rows, device)
            self.losses = torch.zeros(self.rows, dtype=torch.float64, device=device)

    def ready(self, row_id: int, device: torch.device) -> int:
        """`row_id` itself (the tables take row ids), the rows allocated on `device` if nothing is yet."""
        self.allocate(device)
        return row_id

    def slot(self, row_id: int, device: torch.device) -> int:
        """The slot of `row_id` (for the losses and counters; the tables take row ids), the rows allocated on
        `device` if nothing is yet."""
        self.allocate(device)
        return row_id % self.rows

    @property
    def is_full(self) -> bool:
        """Whether every row is taken."""
        return self.next_id - self.first_id >= self.rows

    def is_live(self, row_id: int) -> bool:
        """Whether row `row_id` is still in the buffers (not taken)."""
        return self.first_id <= row_id < self.next_id

    @property
    def pending_values(self) -> int:
        """Small values waiting in the tables."""
        return sum(table.pending_values for table in self.tables)

    def close_step(self) -> None:
        """A recorded step closed: write the tables once enough steps or values wait."""
        self.closed += 1
        if self.closed >= PENDING_STEPS or self.pending_values >= PENDING_VALUES:
            self.flush()

    def flush(self) -> None:
        """Write every observation waiting into its row."""
        self.closed = 0
        for table in self.tables:
            table.flush()

    def new_row(self, step: int) -> int:
        """Open a row for `step` and return its id (the caller takes the rows first when full)."""
        row_id = self.next_id
        slot = row_id % self.rows
        self.next_id += 1
        self.steps[slot] = step
        self.loss_calls[slot] = 0
        self.grad_factors[slot] = None
        self.settings[slot] = None
        return row_id

    def set_settings(self, row_id: int, settings: torch.Tensor) -> None:
        """Keep the learning rate and epsilon of each parameter (params, 2) for row `row_id`'s step."""
        if self.is_live(row_id):
            self.settings[row_id % self.rows] = settings

    def take(self, stop_id: int | None = None) -> Chunk | None:
        """Move rows up to `stop_id` (default: all) to the CPU and return them (`None`: no row)."""
        stop = self.next_id if stop_id is None else stop_id
        slots = [row_id % self.rows for row_id in range(self.first_id, stop)]
        if not slots:
            return None
        self.flush()
        chunk = self._finish(slots)
        chunk.residual = self.residual.take(slots)
        chunk.attention = self.attention.take(slots)
        self.first_id = stop
        if self.device is not None and self.losses is not None:  # the taken rows start empty when they come round
            index = torch.tensor(slots, device=self.device)
            for table in self.tables:
                table.reset(index)
            self.losses.index_fill_(0, index, 0.0)
        return chunk

    def _finish(self, slots: list[int]) -> Chunk:
        used, nan = len(slots), math.nan
        steps = torch.tensor([self.steps[s] for s in slots], dtype=torch.int64)
        if self.device is None:  # nothing was ever observed
            empty = torch.full((used,), nan, dtype=torch.float64)
            return Chunk(
                steps=steps,
                activations=torch.full((used, self.modules, len(STATISTICS)), nan, dtype=torch.float64),
                histograms=torch.zeros(used, self.modules, self.bins + 2, dtype=torch.float64),
                exponents=torch.zeros(used, self.modules, dtype=torch.int64),
                output_grads=torch.full((used, self.modules, 2), nan, dtype=torch.float64),
                param_grads=torch.full((used, self.params, 2), nan, dtype=torch.float64),
                update_ratios=torch.full((used, self.params), nan, dtype=torch.float64),
                losses=empty,
                loss_counts=torch.zeros(used, dtype=torch.float64),
                residual=torch.zeros(0),
                optimizer=torch.full((used, self.params, len(OPTIMIZER_STATS)), nan, dtype=torch.float64),
            )
        index = torch.tensor(slots, device=self.device)
        acts = self.acts
        records = _rows(acts.records, index)
        hists = _rows(acts.hists, index) if acts.hists is not None else torch.zeros(used, self.modules, self.bins + 2)
        exponents = _rows(acts.exponents, index) if acts.exponents is not None else torch.zeros(used, self.modules)
        grads = _rows(self.grads.norms, index)
        factors = [self.grad_factors[s] for s in slots]
        if any(f is not None for f in factors):  # norms of the scaled loss's gradients (GradScaler): unscale them
            ones = torch.ones((), dtype=torch.float64)
            grads[..., 0] *= torch.stack([ones if f is None else f.double().cpu() for f in factors])[:, None]
        updates = _rows(self.updates.norms, index)
        calls = torch.tensor([self.loss_calls[s] for s in slots], dtype=torch.float64)
        losses = _rows(self.losses, index)
        param_grads = _grad_stats(_rows(self.param_grads.norms, index))
        return Chunk(
            steps=steps,
            activations=finalize(records),
            histograms=hists.double(),
            exponents=exponents.long(),
            output_grads=_grad_stats(grads),
            param_grads=param_grads,
            update_ratios=_ratios(updates, self.params),
            losses=torch.where(calls > 0, losses / calls.clamp(min=1), nan),
            loss_counts=calls,
            residual=torch.zeros(0),
            optimizer=self._against_optimizer(param_grads, updates, slots),
            has_loss=bool((calls > 0).any()),
        )

    def _against_optimizer(self, param_grads: torch.Tensor, updates: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """(S, params, 4): gradient RMS, update RMS / learning rate, epsilon, learning rate (`OPTIMIZER_STATS`), NaN
        where unknown."""
        nan = math.nan
        unknown = torch.full((self.params, 2), nan, dtype=torch.float64)
        settings = torch.stack([_or(self.settings[slot], unknown) for slot in slots])
        root = self.param_sizes.clamp(min=1).sqrt()
        change = updates[:, : self.params]
        seen = change[..., NORM.index("count")] > 0
        update_rms = torch.where(seen, change[..., 0].double() / root, nan) / settings[..., 0]
        return torch.stack((param_grads[..., 0] / root, update_rms, settings[..., 1], settings[..., 0]), dim=-1)


def _or(found: torch.Tensor | None, otherwise: torch.Tensor) -> torch.Tensor:
    return otherwise if found is None else found


def _rows(table: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor:
    if table is None:
        raise RuntimeError("the watch's rows were not allocated")
    return table.index_select(0, index).cpu()


def _grad_stats(norms: torch.Tensor) -> torch.Tensor:
    """Norm records (S, N, len(NORM)) -> (S, N, 2): the norm and the non-finite count, NaN where nothing was seen."""
    seen = norms[..., NORM.index("count")] > 0
    stats = norms[..., : NORM.index("count")]
    return torch.where(seen[..., None], stats, math.nan)


def _ratios(updates: torch.Tensor, params: int) -> torch.Tensor:
    """(S, 2 * params, len(NORM)) change and weight norms -> (S, params) update ratios, NaN where not recorded."""
    change, weight = updates[:, :params], updates[:, params:]
    seen = weight[..., NORM.index("count")] > 0
    return torch.where(seen, ratio_of_norms(change[..., 0], weight[..., 0]), math.nan)
