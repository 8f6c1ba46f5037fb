"""`LossLog`: the loss of every step of a watched run, measured or not, kept on the device until a flush.

`watch.log_loss(loss)` adds the loss to the open step's slot here at every step (one small in-place add on the
loss's device, no host sync), whether or not the step is measured; a step logged several times keeps the mean. A
flush moves the waiting slots to the host in one transfer. On the host at most `limit` steps are kept: past it,
every other kept step is dropped and only every `stride`-th step is kept from then on (the first and the latest
stay), so the series spans the whole run as the measured series do. `WatchResults.logged_steps` and
`logged_losses` are what `table()` returns; a non-finite loss keeps its value (the doctor finds the first).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SLOTS", "LossLog"]

SLOTS = 512
"""Steps whose losses wait on the device before they are moved to the host together."""


class LossLog:
    """The loss of every step, on the device until `take()`, then on the host.

    Args:
        limit: The most steps kept on the host (`None`: all).
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.stride = 1
        self._sums: torch.Tensor | None = None  # (SLOTS,) float64 on the losses' device
        self._steps: list[int] = []  # the step of each waiting slot
        self._calls: list[int] = []  # how many losses each waiting slot holds
        self._kept: list[_Part] = []  # (steps, sums, calls) on the CPU, the steps on the stride
        self._tail: _Part | None = None  # the latest step, while it is off the stride
        self._origin: int | None = None  # the first step logged: the stride counts from it

    @property
    def is_full(self) -> bool:
        """Whether every slot on the device is taken (`take()` before the next step's loss)."""
        return len(self._steps) >= SLOTS

    def add(self, step: int, value: torch.Tensor) -> None:
        """Add the 0-d float64 loss `value` of step `step` (steps come in order; the same step again is averaged)."""
        if self._sums is not None and self._sums.device != value.device:
            self.take()
        if self._sums is None:
            self._sums = torch.zeros(SLOTS, dtype=torch.float64, device=value.device)
        if not self._steps or self._steps[-1] != step:
            if self.is_full:
                self.take()
            self._steps.append(step)
            self._calls.append(0)
        slot = len(self._steps) - 1
        self._sums[slot : slot + 1].add_(value.reshape(1))
        self._calls[slot] += 1

    def take(self) -> None:
        """Move the waiting losses to the host (one transfer); thin the kept steps past `limit`."""
        count = len(self._steps)
        if not count or self._sums is None:
            return
        sums = self._sums[:count].to("cpu", copy=True)  # a copy also on the CPU: the slots are zeroed next
        self._sums[:count].zero_()
        chunk = (torch.tensor(self._steps, dtype=torch.int64), sums, torch.tensor(self._calls, dtype=torch.float64))
        self._steps, self._calls = [], []
        if self._origin is None:
            self._origin = int(chunk[0][0])
        tail, self._tail = self._tail, None
        if tail is not None and int(tail[0][0]) == int(chunk[0][0]):  # the step went on across the flush
            chunk = _cat([tail, chunk])
        self._keep(chunk)

    def _keep(self, chunk: _Part) -> None:
        """Keep the steps of `chunk` on the stride, and its last step while it is the latest; thin past `limit`."""
        on_stride = self._on_stride(chunk[0])
        self._kept.append(_select(chunk, on_stride))
        if not bool(on_stride[-1]):
            self._tail = _select(chunk, torch.arange(len(chunk[0])) == len(chunk[0]) - 1)
        while self.limit is not None and sum(len(part[0]) for part in self._kept) > self.limit:
            self.stride *= 2
            self._kept = [_select(part, self._on_stride(part[0])) for part in self._kept]

    def _on_stride(self, steps: torch.Tensor) -> torch.Tensor:
        return (steps - (self._origin or 0)) % self.stride == 0

    def _joined(self) -> _Part:
        """The kept (steps, sums, calls) and the latest step, one entry per step (a step taken in two flushes is
        summed)."""
        parts = [*self._kept, *([] if self._tail is None else [self._tail])]
        if not parts:
            empty = torch.zeros(0, dtype=torch.float64)
            return torch.zeros(0, dtype=torch.int64), empty, empty
        steps, sums, calls = _cat(parts)
        unique, inverse = torch.unique_consecutive(steps, return_inverse=True)
        if len(unique) == len(steps):
            return steps, sums, calls
        total = torch.zeros(len(unique), dtype=torch.float64)
        count = torch.zeros(len(unique), dtype=torch.float64)
        return unique, total.index_add_(0, inverse, sums), count.index_add_(0, inverse, calls)

    def table(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`(steps, losses)` of every step kept, int64 and float64 on the CPU (waiting ones taken first), or `None`
        when no loss was ever logged."""
        self.take()
        steps, sums, calls = self._joined()
        if not len(steps):
            return None
        return steps, sums / calls

    def state_dict(self) -> dict[str, Any]:
        """The kept steps (waiting ones taken first), for a resumed run."""
        self.take()
        steps, sums, calls = self._joined()
        return {"steps": steps, "sums": sums, "calls": calls, "stride": self.stride}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (checked by the caller)."""
        self._steps, self._calls, self._tail = [], [], None
        self.stride = int(saved["stride"])
        steps = saved["steps"].to(torch.int64)
        self._origin = int(steps[0]) if len(steps) else None
        self._kept = []
        if len(steps):
            self._keep((steps, saved["sums"].double(), saved["calls"].double()))


_Part = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (steps int64, sums float64, calls float64) on the CPU


def _cat(parts: list[_Part]) -> _Part:
    steps, sums, calls = (torch.cat(tensors) for tensors in zip(*parts, strict=True))
    return steps, sums, calls


def _select(part: _Part, keep: torch.Tensor) -> _Part:
    return part[0][keep], part[1][keep], part[2][keep]
