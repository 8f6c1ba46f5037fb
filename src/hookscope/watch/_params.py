"""Parameter gradients (before an optimizer step) and update-to-weight ratios (around it) of one watch.

Small parameters (fewer than `BATCH_BELOW` values) are handled together: their gradients are concatenated into
the step's batched pass (`_batch.py`), their values into one flat copy before the optimizer step and one after,
whose difference and weight join the batched pass too, so a model with many small parameters pays a fixed number
of calls. Large ones get one dot product each (and one reused copy for their ratio). FSDP2 parameters are read
as this rank's shard.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ._buffers import PARAM_GRAD, UPDATE, WEIGHT, StepBuffers
from ._kernels import BATCH_BELOW, grad_vector, sum_of_squares
from ._options import WatchOptions
from ._step import StepWriter

__all__ = ["ParamRecorder"]


class ParamRecorder(StepWriter):
    """The parameter half of a recorder: `record_param_grads`, `snapshot`, `record_ratios`."""

    def __init__(self, options: WatchOptions, buffers: StepBuffers, params: list[nn.Parameter]) -> None:
        super().__init__(options, buffers)
        self.open_row = -1  # the row id of the open step, also between its batches
        self.bind_params(params)

    def bind_params(self, params: list[nn.Parameter]) -> None:
        """Watch `params` (a new fit of the same model, or none at all after removal)."""
        self.params = params
        self._sharded = any(_is_dtensor(p) for p in params)
        self._copies: list[torch.Tensor] | None = None  # the large weights before an optimizer step
        self._flat_before: torch.Tensor | None = None  # the small ones, concatenated
        self._snapshot_row = -1

    def record_param_grads(self) -> None:
        """Keep the norm and non-finite count of every watched parameter's `.grad` for the open step."""
        log = self.log
        if self.open_row < 0 or log is None or not self.params or "param_grads" not in self.options.groups:
            return
        present = [
            (i, _local(p.grad) if self._sharded else p.grad)
            for i, p in enumerate(self.params)
            if p.grad is not None and p.grad.layout == torch.strided
        ]
        if not present:
            return
        small = [(i, g) for i, g in present if g.numel() < BATCH_BELOW]
        with torch.no_grad():
            flat = _flatten([g for _, g in small]) if small else None
        parts = tuple((PARAM_GRAD, i, tuple(g.shape)) for i, g in small)
        large = [(i, grad_vector(g.detach())) for i, g in present if g.numel() >= BATCH_BELOW]
        seen = {i for i, _ in present}
        log.params = (flat, parts, large, [i for i in range(len(self.params)) if i not in seen])
        log.values += 0 if flat is None else flat.numel()
        self.buffers.param_seen[self.open_row % self.buffers.rows] = True

    def snapshot(self) -> None:
        """Copy the watched parameters before an optimizer step of a recorded step: small ones into one flat
        tensor (one call), large ones into reused buffers."""
        if self.open_row < 0 or not self.params or "update_ratios" not in self.options.groups:
            return
        small, large = self._param_split()
        current = self._values()
        with torch.no_grad():
            self._flat_before = _flatten([current[i] for i in small]) if small else None
            copies = self._copies
            if copies is None or any(c.shape != current[i].shape for c, i in zip(copies, large, strict=True)):
                copies = self._copies = [torch.empty_like(current[i]) for i in large]
            if large:
                torch._foreach_copy_(copies, [current[i] for i in large])
        self._snapshot_row = self.open_row

    def record_ratios(self) -> None:
        """Keep what ||W_after - W_before|| / ||W_after|| of each watched parameter needs, for the snapshot's step:
        small parameters' change and weight go into the step's batched pass (their sums of squares are taken
        there), large ones' sums of squares are taken now (multi-tensor ops) and written into the row."""
        row_id, copies, log = self._snapshot_row, self._copies, self.log
        if row_id < 0 or copies is None:
            return
        self._snapshot_row = -1
        if not self.buffers.is_live(row_id) or not self.params or log is None or log.row != row_id:
            self.drop("late_update")
            return
        small, large = self._param_split()
        current = self._values()
        with torch.no_grad():
            if small and self._flat_before is not None:
                after = _flatten([current[i] for i in small])
                moved = self._flat_before.sub_(after)
                shapes = [tuple(current[i].shape) for i in small]
                log.ratios = [
                    (moved, tuple((UPDATE, i, shape) for i, shape in zip(small, shapes, strict=True))),
                    (after, tuple((WEIGHT, i, shape) for i, shape in zip(small, shapes, strict=True))),
                ]
                log.values += 2 * moved.numel()
            if large:
                torch._foreach_sub_(copies, [current[i] for i in large])
                squares = sum_of_squares(copies + [current[i].detach() for i in large])  # changes, then weights
                row = self.buffers.row(row_id, squares.device)
                at = self.buffers.layout.ratio_at
                columns = [at + 2 * i for i in large] + [at + 2 * i + 1 for i in large]
                row.index_copy_(0, self.positions(columns, row.device), _as(squares, row.dtype))
        self._flat_before = None
        self.buffers.ratio_seen[row_id % self.buffers.rows] = True

    def _param_split(self) -> tuple[list[int], list[int]]:
        """Indices of the small watched parameters (batched) and of the large ones."""
        values = self._values()
        small = [i for i, p in enumerate(values) if p.numel() < BATCH_BELOW]
        return small, [i for i, p in enumerate(values) if p.numel() >= BATCH_BELOW]

    def _values(self) -> list[torch.Tensor]:
        """The watched parameters' values as plain tensors: this rank's shard of a DTensor (FSDP2)."""
        return [_local(p) for p in self.params] if self._sharded else list(self.params)


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """All values of `tensors` (gradients, or parameters under `no_grad`) in one new flat float32 tensor.

    `flatten_dense_tensors` of a single tensor returns a view of it, not a copy: the copy is made here, or the
    snapshot of a lone parameter would be the parameter itself (and `sub_` on it would write into the weight).
    """
    flat = torch._C._nn.flatten_dense_tensors(tensors)
    if len(tensors) == 1 and flat.dtype == torch.float32:
        flat = flat.clone()
    return _as(flat, torch.float32)


def _as(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor` in `dtype`, without a call when it already is."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _is_dtensor(tensor: torch.Tensor) -> bool:
    return type(tensor).__name__ == "DTensor" or type(getattr(tensor, "data", None)).__name__ == "DTensor"


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2 parameters and gradients); any other tensor as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) and _is_dtensor(tensor) else tensor
