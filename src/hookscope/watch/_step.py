"""What a recorded step adds to the device rows, and when the rows are written.

`StepWriter` is the part of a recorder that turns what hooks see into observations of the open step's row in the
engine's tables (`_buffers.py`): activations and output gradients as they come, the loss when it is logged. The
tables keep small tensors waiting; they are written together once `PENDING_STEPS` recorded steps have closed or
`PENDING_VALUES` small values wait, and whenever the rows are read, so a steady training loop pays a fixed
number of torch calls per batch of steps, not per module.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .._torch import is_view
from ._buffers import StepBuffers
from ._options import WatchOptions

__all__ = ["PENDING_STEPS", "PENDING_VALUES", "StepWriter"]

PENDING_STEPS = 32
"""Closed recorded steps whose small tensors wait to be described together."""
PENDING_VALUES = 1 << 20
"""Small values waiting (float32, 4 MiB) that make the tables write them at once."""


class StepWriter:
    """The device-side rows of a recorder and what the open step adds to them; `Recorder` adds the hooks."""

    dropped: dict[str, int]

    def __init__(self, options: WatchOptions, buffers: StepBuffers) -> None:
        self.options = options
        self.buffers = buffers
        self.open_row = -1  # the row id of the open recorded step (-1: none)
        self._closed = 0  # recorded steps closed since the rows were last written

    def drop(self, reason: str, count: int = 1) -> None:
        """Count `count` observations not kept, by reason."""
        raise NotImplementedError

    def modules(self) -> list[nn.Module | None]:
        """The watched modules (`None` for those deleted)."""
        raise NotImplementedError

    def begin(self, row: int) -> None:
        """A recorded step opens in row `row`."""
        self.open_row = row

    def _ready(self, row: int, device: torch.device) -> int:
        """Row id `row`, the rows allocated on `device` if nothing is yet (the tables take row ids)."""
        self.buffers.allocate(device)
        return row

    def observe_activation(self, row: int, index: int, x: torch.Tensor, *, owned: bool = False) -> None:
        """Add output `x` (detached) of module `index` to row `row`."""
        self.buffers.acts.add(self._ready(row, x.device), index, x, owned=owned)

    def observe_grad(self, row: int, index: int, grad: torch.Tensor) -> None:
        """Add the gradient of module `index`'s output to row `row`; counted `late_gradient` once it is taken.

        A gradient autograd hands to a hook is kept as it is, not copied: autograd never writes into it afterwards
        (and while the table holds it, `AccumulateGrad` cannot adopt it as a `.grad` to accumulate into); a view
        is copied, so that it does not keep a larger buffer alive."""
        if not self.buffers.is_live(row):
            self.drop("late_gradient")
            return
        self.buffers.grads.add(self._ready(row, grad.device), index, grad, owned=not is_view(grad))

    def set_grad_factor(self, factor: torch.Tensor | None) -> None:
        """`1 / loss scale` of the open step's backward (GradScaler): its output-gradient norms are divided by it."""
        if self.open_row >= 0 and factor is not None:
            self.buffers.grad_factors[self.open_row % self.buffers.rows] = factor

    def log_loss(self, loss: torch.Tensor | float) -> None:
        """Add `loss` to the open row's loss (averaged over the calls of the step); count it dropped otherwise."""
        row = self.open_row
        if row < 0:
            self.drop("sampling_loss")
            return
        value = loss.detach().double().mean() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))
        slot = self.buffers.slot(row, value.device)
        losses = self.buffers.losses
        if losses is not None:
            losses[slot : slot + 1].add_(value.reshape(1).to(losses))
        self.buffers.loss_calls[slot] += 1

    def close_step(self) -> None:
        """A recorded step closed: write the rows once enough steps or values wait."""
        self._closed += 1
        if self._closed >= PENDING_STEPS or self.buffers.pending_values >= PENDING_VALUES:
            self.write_pending()

    def write_pending(self) -> None:
        """Write every observation waiting into its row."""
        self._closed = 0
        self.buffers.flush()
