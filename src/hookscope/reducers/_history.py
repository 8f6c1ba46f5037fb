"""Reducers that keep observations as they are: every push, a ring buffer of the last few, or the latest."""

from __future__ import annotations

from typing import Any

import torch

from .._check import DEVICE, checked
from .._schema import ListOf, Record, Tensor
from ._base import Reducer, single

__all__ = ["HistoryReducer", "PassthroughReducer"]


class HistoryReducer(Reducer):
    """Keep every push, or the last `capacity` pushes in a ring buffer.

    Observations are stored as detached copies (an in-place op after the module cannot change them), on the
    device they came from or on `device` (for instance `"cpu"` to offload; the copy is asynchronous and reads
    wait for it). Shapes may change between pushes.

    Args:
        capacity: How many pushes to keep (the newest); `None` keeps all.
        device: Where to store the copies; `None` keeps them where they are.

    Raises:
        ValueError: `capacity` is not a positive int or `None`.

    Example:
        >>> import torch
        >>> history = HistoryReducer(capacity=2)
        >>> for value in range(5):
        ...     history.push(torch.tensor([float(value)]))
        >>> history.dump().flatten().tolist(), history.dropped
        ([3.0, 4.0], 3)
    """

    keeps_history = True
    STATE = Record(kept=ListOf(Tensor(), max_length="capacity"))

    @checked(device=DEVICE)
    def __init__(self, capacity: int | None = None, device: torch.device | str | None = None) -> None:
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be a positive int or None, got {capacity!r}")
        super().__init__()
        self.capacity = capacity
        self.storage = None if device is None else torch.device(device)
        self._kept: list[torch.Tensor] = []
        self._start = 0
        self._copying = False

    def config(self) -> dict[str, Any]:
        """Return the constructor arguments."""
        return {"capacity": self.capacity, "device": None if self.storage is None else str(self.storage)}

    def peek(self) -> torch.Tensor | None:
        """Return the latest push, or `None` when empty."""
        kept = self._ordered()
        return kept[-1] if kept else None

    def dump(self) -> torch.Tensor | list[torch.Tensor] | None:
        """Return the kept pushes, oldest first, stacked (a list when their shapes differ); `None` when empty."""
        kept = self._ordered()
        if not kept:
            return None
        if all(t.shape == kept[0].shape for t in kept):
            return torch.stack(kept)
        return kept

    def view(self, step: int) -> torch.Tensor:
        """Return push number `step` (from 0 since the last clear; negative counts from the latest).

        Raises:
            ValueError: push `step` was never made, or was dropped past capacity.
        """
        kept = self._ordered()
        first = self._pushes - len(kept)
        is_int = isinstance(step, int) and not isinstance(step, bool)
        index = step + self._pushes if is_int and step < 0 else step
        if not is_int or not first <= index < self._pushes:
            raise ValueError(
                f"step must be a kept push, from {first} to {self._pushes - 1} (or negative from the latest), got "
                f"{step!r}; earlier pushes were dropped past capacity={self.capacity}"
            )
        return kept[index - first]

    def _push(self, tensors: tuple[torch.Tensor, ...]) -> None:
        tensor = single(type(self).__name__, tensors)
        if self.storage is None:
            copy = tensor.clone()
        else:
            self._copying = self._copying or (tensor.device.type == "cuda" and self.storage.type == "cpu")
            copy = tensor.to(self.storage, copy=True, non_blocking=True)
        if self.capacity is None or len(self._kept) < self.capacity:
            self._kept.append(copy)
            return
        self._kept[self._start] = copy
        self._start = (self._start + 1) % self.capacity
        self._dropped += 1

    def _ordered(self) -> list[torch.Tensor]:
        if self._copying:  # asynchronous device-to-host copies must land before the host reads them
            torch.cuda.synchronize()
            self._copying = False
        return self._kept[self._start :] + self._kept[: self._start]

    def _reset(self) -> None:
        self._kept = []
        self._start = 0

    def _move(self, device: torch.device) -> None:
        if self.storage is None:
            self._kept = [t.to(device) for t in self._kept]

    def _state(self) -> dict[str, Any]:
        return {"kept": self._ordered()}

    def _sizes(self) -> dict[str, int]:
        return {} if self.capacity is None else {"capacity": self.capacity}

    def _load(self, state: dict[str, Any]) -> None:
        kept = [t.clone() for t in state["kept"]]
        if self.storage is not None:
            kept = [t.to(self.storage) for t in kept]
        self._kept = kept
        self._start = 0


class PassthroughReducer(HistoryReducer):
    """Keep only the latest push (`dropped` counts the ones it replaced).

    Example:
        >>> import torch
        >>> latest = PassthroughReducer()
        >>> latest.push(torch.ones(2)); latest.push(torch.zeros(2))
        >>> latest.peek().tolist(), latest.dropped
        ([0.0, 0.0], 1)
    """

    def __init__(self) -> None:
        super().__init__(capacity=1)

    def config(self) -> dict[str, Any]:
        """Return the constructor arguments (none)."""
        return {}
