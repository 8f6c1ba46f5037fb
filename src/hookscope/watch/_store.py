"""The host-side store of recorded steps: bounded by `capacity`, thinned by halving the rate when full."""

from __future__ import annotations

from ._buffers import Chunk

__all__ = ["SeriesStore"]


class SeriesStore:
    """Recorded steps on the CPU, at most `capacity` of them (`None`: unbounded).

    When full, every other kept step is dropped (`dropped` counts them) and the recording rate halves
    (`stride` doubles), so the kept steps always span the whole run at an even spacing.
    """

    def __init__(self, capacity: int | None, every: int) -> None:
        self.capacity = capacity
        self.every = every
        self.stride = 1
        self.dropped = 0
        self._chunks: list[Chunk] = []

    def records(self, step: int) -> bool:
        """Whether `step` is to be recorded under `every` and the current thinning stride."""
        return step % self.every == 0 and (step // self.every) % self.stride == 0

    def __len__(self) -> int:
        return sum(len(c) for c in self._chunks)

    def add(self, chunk: Chunk) -> Chunk:
        """Keep `chunk`'s steps that the current stride records, thin when over capacity; return what was kept."""
        kept = self._filter(chunk)
        if len(kept):
            self._chunks.append(kept)
        if self.capacity is not None and len(self) > self.capacity:
            self._thin()
        return kept

    def _filter(self, chunk: Chunk) -> Chunk:
        keep = (chunk.steps // self.every) % self.stride == 0
        if bool(keep.all()):
            return chunk
        self.dropped += int((~keep).sum())
        return chunk.select(keep)

    def _thin(self) -> None:
        table = Chunk.concat(self._chunks)
        capacity = self.capacity or len(table)
        while len(table) > capacity:
            self.stride *= 2
            keep = (table.steps // self.every) % self.stride == 0
            self.dropped += int((~keep).sum())
            table = table.select(keep)
        self._chunks = [table] if len(table) else []

    def table(self) -> Chunk | None:
        """All kept steps as one chunk (`None` when nothing was kept)."""
        if not self._chunks:
            return None
        if len(self._chunks) > 1:
            self._chunks = [Chunk.concat(self._chunks)]
        return self._chunks[0]

    def restore(self, table: Chunk | None, stride: int, dropped: int) -> None:
        """Replace the contents (used when loading a state dict)."""
        self._chunks = [table] if table is not None and len(table) else []
        self.stride, self.dropped = stride, dropped
