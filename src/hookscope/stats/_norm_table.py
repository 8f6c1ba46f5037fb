"""`NormTable`: norm records (gradients, updates, weights) per cell, written in batches (see `_pending.py`)."""

from __future__ import annotations

import math

import torch

from ._batched import Segments, norm_segments
from ._describe import take_sample
from ._norms import NORM, combine_norm_segments, estimate_norms, norm_of, real_view
from ._pending import PendingTable
from ._sample import Sampler

__all__ = ["NormTable"]


class NormTable(PendingTable):
    """Norm records (`NORM`: the norm of the finite values, non-finite and value counts, sampled count) per cell.

    Args:
        keys: The number of keys (modules or parameters).
        sampler: Read large tensors as sums and a sample (`None`: exactly).
    """

    def __init__(self, keys: int, sampler: Sampler | None = None) -> None:
        super().__init__(keys, sampler)
        self.norms: torch.Tensor | None = None  # (rows, keys, len(NORM)) float64

    def add(self, row: int, key: int, x: torch.Tensor, *, owned: bool = False) -> None:
        """Observe `x` in cell (row id, key) (complex tensors count |z|)."""
        if x.is_complex():
            x, owned = real_view(x.detach()), False
        if x.numel() == 0:
            return
        if self._is_small(x):
            self._keep_small(row, key, x, owned)
        elif self.sampler is not None and self._is_sampled(x):
            self._sampled.append((row, key, take_sample(x, self.sampler, with_sum=False), None))
        else:
            self._large.append((row, key, norm_of(x.detach())))

    def add_flat(self, row: int, keys: list[int], shapes: list[tuple[int, ...]], flat: torch.Tensor) -> None:
        """Observe several small tensors of row id `row` given concatenated in `flat` (a float32 tensor nobody else
        holds: the parameters of an optimizer step in one copy), `keys[i]` of shape `shapes[i]`."""
        self._keep_flat(row, keys, shapes, flat)

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
        items: list[torch.Tensor] = []
        cells: list[tuple[int, int]] = []
        if self._small:
            base, parts, values = self._small_parts()
            segments, groups = self._layout(("small", parts), lambda: self._small_layout(parts))
            items.append(norm_segments(values, segments))
            cells += [(base + row, key) for row, key in groups]
        if self._sampled:
            parts_s, values, raw = self._sampled_values()
            segments, numel = self._layout(("sampled", parts_s), lambda: self._sampled_layout(parts_s))
            items.append(estimate_norms(raw, numel, norm_segments(values, segments)))
            cells += [(row, key) for row, key, _, _ in self._sampled]
        if self._large:
            items.append(torch.stack([item for _, _, item in self._large]))
            cells += [(row, key) for row, key, _ in self._large]
        self._clear()
        unique, segment = self._cells(cells)
        norms = self.norms.view(-1, len(NORM))
        every = torch.cat([*items, norms.index_select(0, unique)])
        norms.index_copy_(0, unique, combine_norm_segments(every, segment, unique.numel()))

    def _small_layout(
        self, parts: tuple[tuple[int, int, tuple[int, ...]], ...]
    ) -> tuple[Segments, list[tuple[int, int]]]:
        ids: dict[tuple[int, int], int] = {}
        owners = [ids.setdefault((row, key), len(ids)) for row, key, _ in parts]
        sizes = [math.prod(shape) for _, _, shape in parts]
        return Segments(sizes, owners, self.device or torch.device("cpu")), list(ids)

    def _sampled_layout(self, parts: tuple[tuple[int, int, int], ...]) -> tuple[Segments, torch.Tensor]:
        device = self.device or torch.device("cpu")
        segments = Segments([size for _, size, _ in parts], list(range(len(parts))), device)
        return segments, torch.tensor([float(n) for _, _, n in parts], dtype=torch.float64).to(device)

    def _grow(self, rows: int, device: torch.device) -> None:
        norms = torch.zeros(rows, self.keys, len(NORM), dtype=torch.float64, device=device)
        if self.norms is not None:
            norms[: self.rows] = self.norms
        self.norms = norms

    def _move(self, device: torch.device) -> None:
        if self.norms is not None:
            self.norms = self.norms.to(device)
        self._layouts.clear()
