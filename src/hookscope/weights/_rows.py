"""Rows of numbers kept on the device: appended without a host sync, read all at once when asked."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import torch

from .._schema import FLOAT, Int, Record, Rule, SchemaError, Tensor, check

__all__ = ["STATE", "LazyMapping", "RowLog"]

V = TypeVar("V")

_FIRST_SIZE = 16

STATE = Record(
    rows=Tensor(FLOAT, shape=("kept", "width")),
    count=Int(min=0),
    first=Int(min=0),
    rules=[Rule("rows", lambda s: s["rows"].shape[0] == s["count"] - s["first"], "must hold count - first rows")],
)
"""The format of `RowLog.state_dict()`; `width` and, for a ring buffer, `capacity` come from the log."""


class RowLog:
    """Fixed-width rows on the device, unbounded (growing by doubling) or a ring buffer of `capacity` rows.

    `append` copies one row into a preallocated buffer (one kernel, no host sync); `rows()` returns the kept
    rows, oldest first. `dropped` counts the rows a full ring buffer overwrote.
    """

    def __init__(self, width: int, capacity: int | None = None, dtype: torch.dtype = torch.float32) -> None:
        if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be a positive int or None, got {capacity!r}")
        self.width = width
        self.capacity = capacity
        self.dtype = dtype
        self.count = 0  # rows ever appended (minus popped)
        self.first = 0  # index of the oldest row still kept
        self._buffer: torch.Tensor | None = None

    @property
    def dropped(self) -> int:
        """How many rows were overwritten because the ring buffer was full."""
        return self.first

    def __len__(self) -> int:
        return self.count - self.first

    def append(self, row: torch.Tensor) -> None:
        """Copy `row` (shape `(width,)`) in as the newest row."""
        buffer = self._room(row.device)
        slot = self.count % self.capacity if self.capacity else self.count
        buffer[slot].copy_(row.detach())
        self.count += 1
        if self.capacity is not None:
            self.first = max(self.first, self.count - self.capacity)

    def pop(self) -> None:
        """Forget the newest row (a ring buffer does not get back a row it overwrote).

        Raises:
            RuntimeError: there is no row to forget.
        """
        if len(self) == 0:
            raise RuntimeError("RowLog has no row to pop")
        self.count -= 1

    def rows(self) -> torch.Tensor:
        """The kept rows, oldest first, on the device. Shape: `(len(self), width)`."""
        if self._buffer is None or len(self) == 0:
            return torch.empty(0, self.width, dtype=self.dtype)
        if self.capacity is None:
            return self._buffer[: self.count]
        index = torch.arange(self.first, self.count, device=self._buffer.device) % self.capacity
        return self._buffer.index_select(0, index)

    def last(self) -> torch.Tensor | None:
        """The newest row, or `None`."""
        if self._buffer is None or len(self) == 0:
            return None
        slot = (self.count - 1) % self.capacity if self.capacity else self.count - 1
        return self._buffer[slot]

    def clear(self) -> None:
        """Forget every row and the dropped count."""
        self.count = self.first = 0

    def state_dict(self) -> dict[str, Any]:
        """The kept rows (on the CPU) and the counters."""
        return {"rows": self.rows().detach().cpu(), "count": self.count, "first": self.first}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (onto the CPU; the next append moves it to its row's device).

        Raises:
            ValueError: the state does not fit this log (width, more rows than the capacity, rows that do not
                match the counters); the log is left as it was.
        """
        self.check_state(state)
        rows, count, first = state["rows"], state["count"], state["first"]
        size = self.capacity or max(_FIRST_SIZE, count)
        buffer = torch.zeros(size, self.width, dtype=self.dtype)
        slots = torch.arange(first, count)
        buffer[slots % self.capacity if self.capacity else slots] = rows.to(self.dtype)
        self._buffer, self.count, self.first = buffer, count, first

    def check_state(self, state: Any, at: str = "state") -> None:
        """Check `state` in full against `STATE` and this log's width and capacity; change nothing.

        Raises:
            SchemaError: the first field that does not fit (a `ValueError`).
        """
        check(STATE, state, at=at, bind={"width": self.width})
        if self.capacity is not None and state["rows"].shape[0] > self.capacity:
            raise SchemaError(
                "state", f"{at}.rows", f"must hold at most capacity={self.capacity} rows, got {state['rows'].shape[0]}"
            )

    def _room(self, device: torch.device) -> torch.Tensor:
        buffer = self._buffer
        if buffer is not None and buffer.device != device:
            buffer = buffer.to(device)
        if buffer is None:
            size = self.capacity or _FIRST_SIZE
            buffer = torch.empty(size, self.width, dtype=self.dtype, device=device)
        elif self.capacity is None and self.count >= buffer.shape[0]:
            grown = torch.empty(2 * buffer.shape[0], self.width, dtype=self.dtype, device=buffer.device)
            grown[: buffer.shape[0]] = buffer
            buffer = grown
        self._buffer = buffer
        return buffer


class LazyMapping(Mapping[str, V]):
    """A read-only mapping whose values are built (read from the device) only when looked up."""

    def __init__(self, keys: Callable[[], Iterable[str]], read: Callable[[str], V]) -> None:
        self._keys = keys
        self._read = read

    def __getitem__(self, key: str) -> V:
        if key not in set(self._keys()):
            raise KeyError(key)
        return self._read(key)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._keys()))

    def __len__(self) -> int:
        return len(list(self._keys()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self)!r})"
