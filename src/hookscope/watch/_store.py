"""The host-side store of measured steps: bounded by `capacity`, thinned by halving the rate kept when full, and
always holding the run's first and latest steps.

Before: `_buffers.py`'s `StepBuffers.take` moves the rows to the host (a `Chunk`), which the stepper adds here.
After: `table()` is read by `_assemble.py`'s `build_results`.
"""

from __future__ import annotations

import torch

from ._buffers import Chunk

__all__ = ["SeriesStore"]


class SeriesStore:
    """Measured steps on the CPU, at most `capacity` of them (`None`: unbounded).

    When full, every other kept step is dropped (`dropped` counts them) and the rate kept halves (`stride`
    doubles), so the kept steps span the whole run at an even spacing. Thinning is of what is kept, never of
    what is measured (`every` measures exactly every `every`-th step): the latest measured step is kept too
    while it is the latest, so a run of any length keeps its first and last steps.
    """

    def __init__(self, capacity: int | None, every: int) -> None:
        self.capacity = capacity
        self.every = every
        self.stride = 1
        self.dropped = 0
        self._chunks: list[Chunk] = []
        self._tail: Chunk | None = None  # the latest measured step, when the stride does not keep it

    def records(self, step: int) -> bool:
        """Whether `step` is measured under `every` (every measured step reaches `add`)."""
        return step % self.every == 0

    def __len__(self) -> int:
        return sum(len(c) for c in self._chunks) + (0 if self._tail is None else len(self._tail))

    def add(self, chunk: Chunk) -> Chunk:
        """Keep `chunk`'s steps that the current stride keeps, and its last step while it is the latest; thin when
        over capacity; return what was kept for good (the latest step waits until a later one replaces it)."""
        if not len(chunk):
            return chunk
        if self._tail is not None:  # a later step came: the provisional one goes
            self.dropped += len(self._tail)
            self._tail = None
        kept = self._filter(chunk)
        if len(kept):
            self._chunks.append(kept)
        last = int(chunk.steps[-1])
        if not len(kept) or int(kept.steps[-1]) != last:
            self.dropped -= 1  # counted by the filter; waits as the latest instead
            self._tail = chunk.select(chunk.steps == last)
        if self.capacity is not None and len(self) > self.capacity:
            self._thin()
        return kept

    def _filter(self, chunk: Chunk) -> Chunk:
        keep = self._keeps(chunk.steps)
        if bool(keep.all()):
            return chunk
        self.dropped += int((~keep).sum())
        return chunk.select(keep)

    def _keeps(self, steps: torch.Tensor) -> torch.Tensor:
        return (steps // self.every) % self.stride == 0

    def _thin(self) -> None:
        table = Chunk.concat(self._chunks) if self._chunks else None
        room = (self.capacity or 0) - (0 if self._tail is None else len(self._tail))
        while table is not None and len(table) > max(room, 1):
            self.stride *= 2
            keep = self._keeps(table.steps)
            self.dropped += int((~keep).sum())
            table = table.select(keep)
        self._chunks = [table] if table is not None and len(table) else []

    def table(self) -> Chunk | None:
        """All kept steps as one chunk, the latest one included (`None` when nothing was kept)."""
        parts = [*self._chunks, *([] if self._tail is None else [self._tail])]
        if not parts:
            return None
        if len(self._chunks) > 1:
            self._chunks = [Chunk.concat(self._chunks)]
        return parts[0] if len(parts) == 1 else Chunk.concat(parts)

    def restore(self, table: Chunk | None, stride: int, dropped: int) -> None:
        """Replace the contents (used when loading a state dict)."""
        self._chunks = [table] if table is not None and len(table) else []
        self._tail = None
        self.stride, self.dropped = stride, dropped
