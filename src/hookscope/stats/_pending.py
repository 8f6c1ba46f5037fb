"""Observations waiting to be written into a table's cells: the part every table shares.

A table has a cell per (row, key): a row is a step of `watch()` or a record of `ActivationStats`, a key a module
or a parameter. Rows are addressed by ids that may grow without bound (a ring of steps): id `r` lives in row
`r % rows`, and the consumer makes sure a row is no longer needed before its id comes round again. Observations
wait here until `flush()`: small tensors as copies (`_small`), large ones as their exact sums and a sample
(`_sampled`, `hookscope.stats.take_sample`) or, described exactly, as finished items (`_large`). Everything that
depends only on the arrangement of what waits (segments, cells) is built once per arrangement and cached, so a
steady training loop pays a fixed number of torch calls per flush, however many rows and keys it covers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._describe import Sample
from ._rows import SAMPLE_BLOCK, Workspace
from ._sample import Sampler

__all__ = ["SMALL_BELOW", "Members", "Part", "PendingTable", "small_copy", "to_device"]

SMALL_BELOW = 1 << 14
"""Tensors with fewer values are copied and described in batches; larger ones are read when they are added (at
twice the sample width, sampling costs less than describing every value)."""

_CACHE = 64  # layouts kept per table (a steady loop needs a handful)
Part = tuple[int, int, tuple[int, ...]]  # (row, key, shape) of a small tensor waiting
Members = tuple[tuple[int, tuple[int, ...]], ...]  # (key, shape) of each tensor a waiting chunk holds, in order


class PendingTable:
    """Cells, the observations waiting for them, and the cached layouts of what waits.

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
        self._work = Workspace()  # the blocks of samples are described in it

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

    def _is_sampled(self, x: torch.Tensor) -> bool:
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
        its position among them."""
        cells = [(row % self.rows) * self.keys + key for row, key in rows_and_keys]
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

    def _describe_waiting(
        self, parts: tuple[Part, ...], values: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """The items of the small tensors waiting (`_small_parts`) and the (row relative to the first, key) of each."""
        raise NotImplementedError

    def _describe_sampled(self, block: list[tuple[int, int, Sample, Any]]) -> torch.Tensor:
        """The items of a block of samples, one per sample."""
        raise NotImplementedError

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

    def flush(self) -> None:
        """Write every observation waiting into its cell."""
        raise NotImplementedError

    def _grow(self, rows: int, device: torch.device) -> None:
        raise NotImplementedError

    def _move(self, device: torch.device) -> None:
        raise NotImplementedError


def small_copy(x: torch.Tensor, owned: bool = False) -> torch.Tensor:
    """What a table keeps of a small tensor: a float32 copy (in-place ops may follow the hook), or `x` itself when
    it is a float32 tensor nobody else holds (`owned`)."""
    if owned and x.dtype == torch.float32:
        return x
    return (x.detach() if x.requires_grad else x).to(torch.float32, copy=True)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move a small index tensor built on the host to `device` (pinned and asynchronous on CUDA: no sync)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
