"""Parameter gradients (before an optimizer step) and update-to-weight ratios (around it) of one watch.

Small parameters (fewer than `SMALL_BELOW` values) are handled together: their gradients are copied into one
flat tensor per step, their values into one flat copy before the optimizer step and one after, and the tables
describe all of them in their batched pass; large ones are described at once (a norm each). The update ratio is
the engine's (`hookscope.stats.ratio_of_norms`): ||W_after - W_before|| / ||W_after||. A large weight is read,
as the tables read every large tensor, as a sample: the same positions (`Sampler`) before and after the optimizer
step, so the norms of its change and of its weight after the step are estimated from the same positions
(`sample_alone`; the `sampled` column of their norm records says so) at the cost of two gathers, where exact ones
cost a copy of the weight and four passes over it, the largest part of a measured step on a model of large
layers. `exact=True` copies and reads every value. FSDP2 parameters are read as this rank's shard.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from .._torch import flatten, foreach_copy_, foreach_sub_
from ..stats._describe import sample_alone, sample_values
from ..stats._dtensor import is_dtensor, local_part
from ..stats._tables import SMALL_BELOW
from ._buffers import StepBuffers
from ._options import WatchOptions
from ._step import StepState

__all__ = ["ParamRecorder"]


class ParamRecorder:
    """The watched parameters of a recorder: `record_grads`, `snapshot`, `record_ratios` into the open step's row.

    Args:
        options: The watch's options (`groups` says what is recorded).
        buffers: The recorder's device rows.
        params: The watched parameters.
        state: The watch's step state (read: which row is open).
        drop: Counts observations not kept, by reason (the recorder's `dropped`).
    """

    def __init__(
        self,
        options: WatchOptions,
        buffers: StepBuffers,
        params: list[nn.Parameter],
        state: StepState,
        drop: Callable[[str], None],
    ) -> None:
        self.options = options
        self.buffers = buffers
        self.state = state
        self.drop = drop
        self.bind(params)

    def bind(self, params: list[nn.Parameter]) -> None:
        """Watch `params` (a new fit of the same model, or none at all after removal)."""
        self.params = params
        self._sharded = any(_is_dtensor(p) for p in params)
        self._copies: list[torch.Tensor] | None = None  # the large weights read whole, before an optimizer step
        self._whole: list[int] = []  # the indices of those
        self._samples: list[tuple[int, torch.Tensor, int, int, torch.Tensor]] = []  # the large weights sampled
        # before it: (index, positions, start, sample size, values)
        self._flat_before: torch.Tensor | None = None  # the small ones, concatenated
        self._snapshot_row = -1
        self._grads_row = -1  # the row whose parameter gradients were taken
        self._settings: torch.Tensor | None = None  # the learning rates and epsilons last recorded
        self._settings_key: tuple[object, ...] | None = None  # what they were read from (`_settings_key`)

    def record_grads(self) -> None:
        """Describe the norm and non-finite count of every watched parameter's `.grad` for the open step; a second
        call in the same step replaces what the first took (a closure step: the gradients its first backward
        made, not the earlier ones the optimizer's step began with)."""
        row = self.state.row
        if row < 0 or not self.params or "param_grads" not in self.options.groups:
            return
        table = self.buffers.param_grads
        if self._grads_row == row:
            table.discard(row)
        self._grads_row = row
        present = [
            (i, _local(p.grad) if self._sharded else p.grad)
            for i, p in enumerate(self.params)
            if p.grad is not None and p.grad.layout == torch.strided
        ]
        if not present:
            return
        slot = self.buffers.ready(row, present[0][1].device)
        small = [(i, g) for i, g in present if g.numel() < SMALL_BELOW and not g.is_complex()]
        with torch.no_grad():
            if small:
                flat = _flatten([g for _, g in small])
                table.add_flat(slot, [i for i, _ in small], [tuple(g.shape) for _, g in small], flat)
            for i, grad in present:
                if grad.numel() >= SMALL_BELOW or grad.is_complex():
                    table.add(slot, i, grad)

    def snapshot(self) -> None:
        """Read the watched parameters before an optimizer step of a recorded step: small ones copied into one
        flat tensor (one call), large ones sampled (`sample_values`) or, where a table reads them whole (float64,
        complex, `exact=True`), copied into reused buffers."""
        if self.state.row < 0 or not self.params or "update_ratios" not in self.options.groups:
            return
        small, large = self._param_split()
        current = self._values()
        table = self.buffers.updates
        sampled: list[int] = []
        self._whole = []
        for i in large:
            if table.is_sampled(current[i]):
                sampled.append(i)
            else:
                self._whole.append(i)
        with torch.no_grad():
            self._flat_before = _flatten([current[i] for i in small]) if small else None
            self._samples = []
            sampler = table.sampler
            if sampler is not None:  # (there is one when a weight is sampled)
                for i in sampled:
                    comb, count, start = sampler.draw_positions(current[i].numel(), current[i].device)
                    self._samples.append((i, comb, start, count, sample_values(current[i], comb, start)))
            copies, whole = self._copies, self._whole
            if copies is None or any(c.shape != current[i].shape for c, i in zip(copies, whole, strict=True)):
                copies = self._copies = [torch.empty_like(current[i]) for i in whole]
            if whole:
                foreach_copy_(copies, [current[i] for i in whole])
        self._snapshot_row = self.state.row

    @property
    def is_snapshot_pending(self) -> bool:
        """Whether weights read before an optimizer step wait for `record_ratios`."""
        return self._snapshot_row >= 0

    def record_ratios(self) -> None:
        """Describe the change of each watched parameter in the optimizer step and its weight after it."""
        row, copies = self._snapshot_row, self._copies
        if row < 0 or copies is None:
            return
        self._snapshot_row = -1
        samples, self._samples = self._samples, []
        if not self.buffers.is_live(row) or not self.params or row != self.state.row:
            self.drop("late_update")
            return
        small, _ = self._param_split()
        current = self._values()
        count = len(self.params)
        table = self.buffers.updates
        with torch.no_grad():
            if small and self._flat_before is not None:
                after = _flatten([current[i] for i in small])
                slot = self.buffers.ready(row, after.device)
                shapes = [tuple(current[i].shape) for i in small]
                table.add_flat(slot, small, shapes, self._flat_before.sub_(after))
                table.add_flat(slot, [count + i for i in small], shapes, after)
            for i, comb, start, size, before in samples:
                slot = self.buffers.ready(row, before.device)
                after, numel = sample_values(current[i], comb, start), current[i].numel()
                table.add_sample(slot, count + i, sample_alone(after, comb, start, numel, size))
                table.add_sample(slot, i, sample_alone(before.sub_(after), comb, start, numel, size))
            if self._whole:
                foreach_sub_(copies, [current[i] for i in self._whole])
                slot = self.buffers.ready(row, copies[0].device)
                for copy, i in zip(copies, self._whole, strict=True):
                    table.add(slot, i, copy)
                    table.add(slot, count + i, current[i])
        self._flat_before = None

    def record_settings(self, optimizer: torch.optim.Optimizer) -> None:
        """Keep, for the open recorded step, each watched parameter's learning rate and epsilon as `optimizer`'s
        param groups hold them after its step (host values; a learning rate kept as a tensor on an accelerator is
        not read: NaN, as no value is read back per step). NaN for parameters it does not train and for
        optimizers without an epsilon."""
        row = self.state.row
        if row < 0 or not self.params or "optimizer" not in self.options.groups:
            return
        key = _settings_key(optimizer)
        if key is None or key != self._settings_key or self._settings is None:
            found = {id(p): group for group in optimizer.param_groups for p in group["params"]}
            nan = float("nan")
            values = [
                (nan, nan) if group is None else (_number(group.get("lr")), _number(group.get("eps")))
                for group in (found.get(id(parameter)) for parameter in self.params)
            ]
            self._settings = torch.tensor(values, dtype=torch.float64)  # one call, not one per value
            self._settings_key = key
        self.buffers.set_settings(row, self._settings)  # read, never written: one tensor serves unchanged steps

    def device(self) -> torch.device:
        """The device of the first watched parameter (the CPU without one)."""
        for parameter in self.params:
            return parameter.device
        return torch.device("cpu")

    def _param_split(self) -> tuple[list[int], list[int]]:
        """Indices of the small watched parameters (batched) and of the large ones."""
        values = self._values()
        small = [i for i, p in enumerate(values) if p.numel() < SMALL_BELOW and not p.is_complex()]
        return small, [i for i, p in enumerate(values) if p.numel() >= SMALL_BELOW or p.is_complex()]

    def _values(self) -> list[torch.Tensor]:
        """The watched parameters' values as plain tensors: this rank's shard of a DTensor (FSDP2)."""
        return [_local(p) for p in self.params] if self._sharded else list(self.params)


def _number(value: object) -> float:
    """A learning rate or epsilon as a float (NaN for none, or a tuple such as Adafactor's epsilons)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.device.type == "cpu":
        return float(value)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else float("nan")


def _settings_key(optimizer: torch.optim.Optimizer) -> tuple[object, ...] | None:
    """What the learning rates and epsilons `record_settings` reads depend on: each param group's `lr`, `eps`
    and parameters (by id: the watched ones are alive, so an id found is theirs); `None` (read them again) when
    `lr` or `eps` is not a plain number (a tensor may change in place)."""
    key: list[object] = []
    for group in optimizer.param_groups:
        lr, eps = group.get("lr"), group.get("eps")
        if not (_is_plain(lr) and _is_plain(eps)):
            return None
        key.append((lr, eps, tuple(map(id, group["params"]))))
    return tuple(key)


def _is_plain(value: object) -> bool:
    """Whether `value` is `None`, an int or float, or a tuple of them (Adafactor's epsilons): compared by value."""
    if type(value) is tuple:
        return all(type(item) in _PLAIN for item in value)
    return type(value) in _PLAIN


_PLAIN = (float, int, type(None))


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """All values of `tensors` in one new flat float32 tensor (a copy, never a view of them: one tensor alone is
    cloned, as `flatten_dense_tensors` would return a view of it). Call under `torch.no_grad()`."""
    if len(tensors) == 1:
        return tensors[0].reshape(-1).to(torch.float32, copy=True)
    flat = flatten(tensors)
    return flat if flat.dtype == torch.float32 else flat.float()


def _is_dtensor(tensor: torch.Tensor) -> bool:
    return is_dtensor(tensor)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2 parameters and gradients); any other tensor as it is."""
    return local_part(tensor)
