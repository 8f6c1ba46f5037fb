"""`NormTable`: norm records (gradients, updates, weights) per cell, written in batches (see `_pending.py`)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ._batched import Segments, norm_segments
from ._describe import take_sample
from ._norms import NORM, combine_norm_segments, estimate_norms, norm_of, real_view
from ._pending import Part, PendingTable, to_device
from ._rows import Rows, norm_rows
from ._sample import Sampler

__all__ = ["NormTable"]


class NormTable(PendingTable):
    """Norm records (`NORM`: the norm of the finite values, non-finite and value counts, sampled count) per cell.

    Args:
        keys: The number of keys (modules or parameters).
        sampler: Read large tensors as sums and a sample (`None`: exactly).
        count_nonfinite: Count the non-finite values of large tensors exactly (a min/max pass each); `False` where
            only the norms are read (update ratios): a non-finite sum of squares then stands for them.
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
        elif self.sampler is not None and self._is_sampled(x):
            sample = take_sample(x, self.sampler, with_sum=False, with_extremes=self.count_nonfinite)
            self._keep_sample(row, key, sample, None)
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
        items, unique, segment = self._take()
        norms = self.norms.view(-1, len(NORM))
        every = torch.cat([items, norms.index_select(0, unique)])
        norms.index_copy_(0, unique, combine_norm_segments(every, segment, unique.numel()))

    def _describe_waiting(
        self, parts: tuple[Part, ...], values: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        segments, groups = self._layout(("small", parts), lambda: self._small_layout(parts))
        return norm_segments(values, segments), groups

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
