"""Activation patching and attribution patching: one cell (site x position x head) at a time, many per forward.

`patch` records the clean and corrupted runs, then runs the corrupted input stacked `k` times along the batch,
copy `j` with one cell patched from the clean run (a `torch.where` on a precomputed mask: no host sync per cell),
and calls `metric` on each copy's share of the output. `attribution_patch` estimates the same effects from one
clean forward and one corrupted forward and backward: gradient x (clean - corrupted), summed over each cell.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from .._check import POSITIVE, checked, one_of, shown
from .._progress import ProgressLine
from ..hooks._select import Selector
from ..hooks._tree import map_tensors
from ._record import record
from ._result import PatchResult
from ._sites import AT, batch_size_of, place_all, resolve, run_model

__all__ = ["attribution_patch", "patch"]

Metric = Callable[[Any], torch.Tensor]
Sweep = str | Sequence[int] | None


@dataclass(frozen=True)
class _Cells:
    """The cells of every site: positions (`None`: all at once) x heads (`None`: all at once), positions first."""

    positions: list[int] | None
    heads: list[int] | None
    n_heads: int | None
    seq: int

    def __len__(self) -> int:
        return len(self.positions or [None]) * len(self.heads or [None])

    def masks(self) -> torch.Tensor:
        """`[cells, seq or 1, n_heads or 1]` bool: where each cell patches."""
        rows = self.seq if self.positions is not None else 1
        columns = self.n_heads if self.heads is not None and self.n_heads else 1
        out = torch.zeros(len(self), rows, columns, dtype=torch.bool)
        cell = 0
        for position in self.positions if self.positions is not None else [None]:
            for head in self.heads if self.heads is not None else [None]:
                out[cell, slice(None) if position is None else position, slice(None) if head is None else head] = True
                cell += 1
        return out


def _sweep(name: str, value: Sweep, size: int | None, what: str) -> list[int] | None:
    """`None`, `"each"` (every index up to `size`) or a list of ints, as a list of indices in `[0, size)`."""
    if value is None:
        return None
    if value == "each":
        return list(range(size or 0))
    items = [] if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) else list(value)
    if not items or any(isinstance(v, bool) or not isinstance(v, int) for v in items):
        raise TypeError(f"{name} must be None, 'each' or a non-empty list of ints, got {shown(value)}")
    indices = [v for v in items if isinstance(v, int)]
    if size is not None and any(not -size <= v < size for v in indices):
        raise ValueError(f"{name} must be in [-{size}, {size}) ({what}), got {value!r}")
    return [v % size if size else v for v in indices]


def _scalar(metric: Metric, output: Any) -> torch.Tensor:
    value = metric(output)
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        shown = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(
            f"metric must return a scalar tensor for one copy's output, got {shown}; e.g. "
            "lambda out: out.logits[:, -1, answer].mean()"
        )
    return value.reshape(())


@dataclass
class _Setup:
    """What both kinds of patching share: the sites, their clean and corrupted values, the cells, the metrics."""

    paths: list[str]
    modules: list[nn.Module]
    clean: list[torch.Tensor]
    corrupted: list[torch.Tensor]
    cells: _Cells
    batch: int
    metric_clean: torch.Tensor

    def masks(self) -> torch.Tensor:
        return self.cells.masks()


def _setup(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Metric,
    select: Selector,
    positions: Sweep,
    heads: Sweep,
    n_heads: int | None,
    at: str,
) -> tuple[_Setup, torch.Tensor]:
    """Record both runs (no grad) and check that the sites, cells and batches fit; return it and the corrupted
    metric."""
    _sweep("positions", positions, None, "")  # the kinds of value, before anything runs
    _sweep("heads", heads, None, "")
    if heads is not None and n_heads is None:
        raise ValueError(f"heads={heads!r} needs n_heads= (how many heads the last dimension holds), got None")
    batch = batch_size_of(clean, "clean")
    if batch_size_of(corrupted, "corrupted") != batch:
        raise ValueError(
            f"clean and corrupted must have the same batch size, got {batch} and {batch_size_of(corrupted, 'c')}"
        )
    chosen = resolve(model, select, "select")
    modules = [module for _, module in chosen]
    with torch.no_grad():
        clean_values, clean_out = _recorded(model, clean, modules, at, chosen)
        corrupted_values, _ = _recorded(model, corrupted, modules, at, chosen)
    paths = [path for path, _ in chosen]
    for path, a, b in zip(paths, clean_values, corrupted_values, strict=True):
        if a.shape != b.shape:
            raise ValueError(
                f"site {path!r} has shape {tuple(a.shape)} on the clean input and {tuple(b.shape)} on the corrupted "
                "one; patching needs the same shape (pad both inputs to the same length)"
            )
    seq = _sequence_length(paths, clean_values, positions)
    swept_positions = _sweep("positions", positions, seq, "the sequence length")
    cells = _Cells(swept_positions, _sweep("heads", heads, n_heads, "n_heads"), n_heads, seq)
    if heads is not None:
        _check_heads_fit(paths, clean_values, int(n_heads or 1))
    setup = _Setup(paths, modules, clean_values, corrupted_values, cells, batch, _scalar(metric, clean_out).detach())
    with torch.no_grad():
        corrupted_metric = _scalar(metric, run_model(model, corrupted))
    return setup, corrupted_metric


def _recorded(
    model: nn.Module, inputs: Any, modules: list[nn.Module], at: str, chosen: list[tuple[str, nn.Module]]
) -> tuple[list[torch.Tensor], Any]:
    with record(model, modules, at=at) as rec:
        output = run_model(model, inputs)
    values = []
    for path, _ in chosen:
        calls = rec.calls(path) if path in rec else []
        if len(calls) != 1:
            raise ValueError(
                f"select must pick sites that run once per forward, got {path!r}, which ran {len(calls)} times; "
                "pick a module that is called once (a block, not a module shared across blocks), and one whose "
                "forward is called (nn.MultiheadAttention uses its out_proj's weights without calling it)"
            )
        values.append(calls[0])
    return values, output


def _sequence_length(paths: list[str], values: list[torch.Tensor], positions: Sweep) -> int:
    if positions is None:
        return 1
    lengths = {int(v.shape[1]) if v.dim() >= 3 else -1 for v in values}
    if -1 in lengths:
        flat = next(p for p, v in zip(paths, values, strict=True) if v.dim() < 3)
        raise ValueError(
            f"positions needs sites of shape [batch, seq, ..., features], got {flat!r}, which has no sequence dim"
        )
    if len(lengths) != 1:
        raise ValueError(f"positions needs sites of one sequence length, got lengths {sorted(lengths)} over {paths}")
    return lengths.pop()


def _check_heads_fit(paths: list[str], values: list[torch.Tensor], n_heads: int) -> None:
    for path, value in zip(paths, values, strict=True):
        if value.shape[-1] % n_heads:
            raise ValueError(
                f"site {path!r} has a last dimension of {value.shape[-1]}, which n_heads={n_heads} does not divide: "
                "heads are contiguous chunks of the last dimension, as in the input of an attention's output "
                "projection (select it with at='input')"
            )


def _view(value: torch.Tensor, heads: bool, n_heads: int | None) -> torch.Tensor:
    return value.view(*value.shape[:-1], int(n_heads or 1), -1) if heads else value


def _mask_shape(value: torch.Tensor, copies: int, cells: _Cells) -> list[int]:
    """Where a `[copies, seq or 1, heads or 1]` mask goes against a `[copies, batch, seq, ..., (heads, d)]` view."""
    shape = [copies] + [1] * (value.dim() + (1 if cells.heads is not None else 0))
    if cells.positions is not None:
        shape[2] = cells.seq
    if cells.heads is not None:
        shape[-2] = int(cells.n_heads or 1)
    return shape


class _Patcher:
    """The edit on one site during the sweep: copy `j` takes the clean value where this chunk's mask says.

    The cells' masks go to the site's device once, before the sweep; each chunk's mask is built there from them
    (a slice copy), so no host-to-device transfer (which synchronizes from pageable memory) runs per chunk.
    """

    def __init__(self, clean: torch.Tensor, cells: _Cells, batch: int, masks: torch.Tensor) -> None:
        self.clean = _view(clean, cells.heads is not None, cells.n_heads)
        self.cells = cells
        self.batch = batch
        self.masks = masks.to(clean.device)  # [cells, seq or 1, heads or 1]
        self.mask: torch.Tensor | None = None

    def select(self, copies: int, first_copy: int, first_cell: int, count: int) -> None:
        """Patch cells `first_cell ...` into copies `first_copy ...` (`count` of them) of the next forward."""
        mask = torch.zeros((copies, *self.masks.shape[1:]), dtype=torch.bool, device=self.masks.device)
        mask[first_copy : first_copy + count] = self.masks[first_cell : first_cell + count]
        self.mask = mask

    def __call__(self, value: torch.Tensor) -> torch.Tensor | None:
        if self.mask is None:
            return None
        copies = self.mask.shape[0]
        viewed = _view(
            value.reshape(copies, self.batch, *value.shape[1:]), self.cells.heads is not None, self.cells.n_heads
        )
        mask = self.mask.view(_mask_shape(value, copies, self.cells))
        return torch.where(mask, self.clean, viewed).reshape(value.shape)


def _repeat(inputs: Any, copies: int, batch: int) -> Any:
    def stack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() and tensor.shape[0] == batch:
            return tensor.repeat(copies, *([1] * (tensor.dim() - 1)))
        return tensor

    return map_tensors(dict(inputs) if isinstance(inputs, Mapping) else inputs, stack)


def _share(output: Any, copy: int, copies: int, batch: int) -> Any:
    def take(tensor: torch.Tensor) -> torch.Tensor:
        if copies > 1 and tensor.dim() and tensor.shape[0] == copies * batch:
            return tensor[copy * batch : (copy + 1) * batch]
        return tensor

    return map_tensors(output, take)


@checked(at=one_of(AT), n_heads=POSITIVE, batch_size=POSITIVE)
def patch(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Metric,
    *,
    select: Selector,
    positions: Sweep = None,
    heads: Sweep = None,
    n_heads: int | None = None,
    at: str = "output",
    batch_size: int | None = None,
    progress: bool | None = None,
) -> PatchResult:
    """Patch the clean run's activations into the corrupted run, one cell (site x position x head) at a time.

    Each cell's effect is the normalised recovery `(metric(patched) - metric(corrupted)) / (metric(clean) -
    metric(corrupted))`: 1 when patching that cell alone restores the clean metric, 0 when it changes nothing
    (NaN where clean and corrupted give the same metric). Cells run several per forward: the corrupted input is
    stacked along the batch, one patched copy per cell, with no host sync per cell. The model's mode
    (train/eval) is left as it is; run it in eval mode for deterministic effects.

    Args:
        model: Any `nn.Module`.
        clean: The clean inputs: a tensor (`model(x)`), a tuple (`model(*args)`) or a dict (`model(**kwargs)`).
        corrupted: The corrupted inputs, of the same form and batch size.
        metric: `metric(output) -> scalar tensor`, called on one copy's output (batch as in `clean`).
        select: The sites (modules), in the one selector language; each must run once per forward.
        positions: `None` (all positions at once), `"each"` (every position of the sequence, dim 1) or a list.
        heads: `None` (the whole last dimension), `"each"` (every head) or a list; needs `n_heads`.
        n_heads: How many contiguous heads the last dimension holds (the input of an output projection).
        at: "output" or "input" (a module's first input).
        batch_size: The most patched copies stacked in one forward (`None`: every cell in one forward).
        progress: Show the sweep's progress (cells done / all cells, counted after each forward, so in steps of
            `batch_size`) on one line of stderr, cleared at the end: `None` on a terminal only (needs rich),
            `True` wherever rich can draw, `False` never. Nothing is drawn for a sweep under half a second.

    Returns:
        A `PatchResult`: `effects` float64 `[sites, cells]`, cells ordered positions first, then heads.

    Raises:
        ValueError: a site matches nothing, runs more than once, or does not fit the positions / heads asked.
        TypeError: `metric` does not return a scalar tensor; inputs hold no batched tensor.
    """
    setup, corrupted_metric = _setup(model, clean, corrupted, metric, select, positions, heads, n_heads, at)
    cells, masks = setup.cells, setup.masks()
    jobs = [(site, cell) for site in range(len(setup.paths)) for cell in range(len(cells))]
    per_forward = batch_size or len(jobs)
    patchers = [_Patcher(value, cells, setup.batch, masks) for value in setup.clean]
    edits = [
        (path, module, patcher) for path, module, patcher in zip(setup.paths, setup.modules, patchers, strict=True)
    ]
    metrics: list[torch.Tensor] = []
    handles = place_all(edits, at, owner="steer.patch()", is_edit=True)
    try:
        line = ProgressLine("patch", len(jobs), "cells", enabled=progress, stacklevel=4)  # -> patch -> @checked
        with torch.no_grad(), line:
            for start in range(0, len(jobs), per_forward):
                chunk = jobs[start : start + per_forward]
                metrics += _run_chunk(model, corrupted, metric, chunk, patchers, setup.batch)
                line.advance(len(chunk))
    finally:
        for handle in reversed(handles):
            handle.remove()
    effects = _normalised(torch.stack(metrics), setup.metric_clean, corrupted_metric)
    return _result(setup, effects.view(len(setup.paths), len(cells)), at, "activation", corrupted_metric)


def _run_chunk(
    model: nn.Module,
    corrupted: Any,
    metric: Metric,
    chunk: list[tuple[int, int]],
    patchers: list[_Patcher],
    batch: int,
) -> list[torch.Tensor]:
    copies = len(chunk)
    spans: dict[int, tuple[int, int, int]] = {}  # site -> (first copy, first cell, count): jobs run site-major
    for copy, (site, cell) in enumerate(chunk):
        first_copy, first_cell, count = spans.get(site, (copy, cell, 0))
        spans[site] = (first_copy, first_cell, count + 1)
    for site, (first_copy, first_cell, count) in spans.items():
        patchers[site].select(copies, first_copy, first_cell, count)
    try:
        output = run_model(model, _repeat(corrupted, copies, batch))
    finally:
        for patcher in patchers:
            patcher.mask = None
    return [_scalar(metric, _share(output, copy, copies, batch)) for copy in range(copies)]


def _normalised(patched: torch.Tensor, clean: torch.Tensor, corrupted: torch.Tensor) -> torch.Tensor:
    corrupted64 = corrupted.detach().to(patched.device, torch.float64)
    span = clean.detach().to(patched.device, torch.float64) - corrupted64
    return ((patched.detach().to(torch.float64) - corrupted64) / span).cpu()


def _result(setup: _Setup, effects: torch.Tensor, at: str, method: str, corrupted: torch.Tensor) -> PatchResult:
    cells = setup.cells
    return PatchResult(
        effects=effects,
        sites=list(setup.paths),
        positions=cells.positions,
        heads=cells.heads,
        at=at,
        method=method,
        metric_clean=float(setup.metric_clean),
        metric_corrupted=float(corrupted),
    )


@checked(at=one_of(AT), n_heads=POSITIVE, batch_size=POSITIVE)
def attribution_patch(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Metric,
    *,
    select: Selector,
    positions: Sweep = None,
    heads: Sweep = None,
    n_heads: int | None = None,
    at: str = "output",
    batch_size: int | None = None,
    progress: bool | None = None,
) -> PatchResult:
    """Estimate `patch`'s effects from gradients (Nanda 2023): one clean forward, one corrupted forward and backward.

    Each cell's effect is `sum over the cell of grad(metric at corrupted) x (clean - corrupted)`, normalised by
    `metric(clean) - metric(corrupted)` as in `patch`: a first-order (linear) estimate of the same quantity. The
    gradients are taken with `torch.autograd.grad`: no parameter's `.grad` changes.

    Args: as `patch` (`batch_size` and `progress` are accepted for the same signature and unused: there is one
    forward per input and one backward, nothing to count).

    Returns:
        A `PatchResult` of the same shape as `patch` gives, with `method="attribution"`.

    Raises:
        ValueError: as `patch`.
    """
    setup, _ = _setup(model, clean, corrupted, metric, select, positions, heads, n_heads, at)
    captured: list[torch.Tensor | None] = [None] * len(setup.paths)
    edits = [
        (path, module, _Capture(captured, index))
        for index, (path, module) in enumerate(zip(setup.paths, setup.modules, strict=True))
    ]
    handles = place_all(edits, at, owner="steer.attribution_patch()", is_edit=True)
    try:
        with torch.enable_grad():
            corrupted_metric = _scalar(metric, run_model(model, corrupted))
            inputs = [value for value in captured if value is not None]
            if len(inputs) != len(captured):  # a site that ran in the recorded runs but not now (a data-dependent path)
                raise RuntimeError("attribution_patch: a site did not run in the corrupted forward with gradients")
            grads = torch.autograd.grad(corrupted_metric, inputs, allow_unused=True)
    finally:
        for handle in reversed(handles):
            handle.remove()
    masks = setup.masks()
    effects = []
    for clean_value, corrupted_value, grad in zip(setup.clean, setup.corrupted, grads, strict=True):
        slope = torch.zeros_like(corrupted_value) if grad is None else grad.detach()
        effects.append(_cell_sums(slope * (clean_value - corrupted_value), setup.cells, masks))
    raw = torch.stack(effects)  # [sites, cells], in units of the metric
    zero = torch.zeros((), dtype=torch.float64, device=raw.device)
    normalised = _normalised(raw.to(torch.float64), setup.metric_clean - corrupted_metric.detach(), zero)
    return _result(setup, normalised, at, "attribution", corrupted_metric.detach())


class _Capture:
    """Keep the corrupted run's value of one site for `autograd.grad` (a leaf that requires grad if nothing before
    it did, so frozen models work too)."""

    def __init__(self, captured: list[torch.Tensor | None], index: int) -> None:
        self.captured = captured
        self.index = index

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        if not value.requires_grad:
            value = value.detach().requires_grad_(True)
        self.captured[self.index] = value
        return value


def _cell_sums(product: torch.Tensor, cells: _Cells, masks: torch.Tensor) -> torch.Tensor:
    """Sum `product` `[batch, seq, ..., features]` over each cell: `[cells]`."""
    viewed = _view(product, cells.heads is not None, cells.n_heads).to(torch.float64)
    keep = ([1] if cells.positions is not None else []) + ([viewed.dim() - 2] if cells.heads is not None else [])
    summed = viewed.sum(dim=[d for d in range(viewed.dim()) if d not in keep])  # the batch dim is always summed
    grid = summed.reshape(masks.shape[1:])
    return (masks.to(grid.device) * grid).sum(dim=(1, 2))
