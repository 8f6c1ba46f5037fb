"""`UnitTable`: the activity counts of every unit of every watched module, in one flat device tensor."""

from __future__ import annotations

import torch

__all__ = ["UnitTable"]


class UnitTable:
    """Per-unit activity counts of every module in one flat tensor; position 0 absorbs values without a unit."""

    def __init__(self, modules: int) -> None:
        self.slots: list[tuple[int, int] | None] = [None] * modules
        self.flat: torch.Tensor | None = None
        self.size = 1

    def slot(self, index: int, units: int, device: torch.device) -> int | None:
        """The first position of module `index`'s `units` counts (allocated once); `None` if its count changed."""
        slot = self.slots[index]
        if slot is not None:
            return slot[0] if slot[1] == units else None
        start, self.size = self.size, self.size + units
        self.slots[index] = (start, units)
        flat = self.flat
        if flat is None or flat.numel() < self.size:
            dtype = torch.float32 if device.type == "mps" else torch.float64
            grown = torch.zeros(max(2 * self.size, 64), dtype=dtype, device=device if flat is None else flat.device)
            if flat is not None:
                grown[: flat.numel()] = flat
            self.flat = grown
        return start

    def views(self) -> list[torch.Tensor | None]:
        """Per module, its counts (`None` before its first observation)."""
        flat = self.flat
        return [None if s is None or flat is None else flat[s[0] : s[0] + s[1]] for s in self.slots]

    def load(self, units: list[torch.Tensor | None]) -> None:
        """Replace the counts by `units` (one tensor or `None` per module)."""
        self.slots, self.flat, self.size = [None] * len(units), None, 1
        for index, counts in enumerate(units):
            if counts is not None:
                start = self.slot(index, counts.numel(), counts.device)
                if self.flat is not None and start is not None:
                    self.flat[start : start + counts.numel()] = counts.reshape(-1)
