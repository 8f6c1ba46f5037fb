"""The hooks of one attached watch and what they write: device rows, unit activity, non-finite flags.

The forward hook of each selected module takes one of three paths, decided once per step by `Watch`: record
(the step is recorded: statistics into the current row, gradient hooks on the outputs), check (an unrecorded
training step: only whether the output and its gradient are finite, AND-ed into a device flag), or skip
(counted in `dropped`). Nothing here reads a device value back to the host.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from ..hooks import HookHandle, register_module_hook, tensor_leaves
from ._buffers import StepBuffers
from ._kernels import (
    activation_vector,
    first_float,
    grad_vector,
    hist_counts,
    hist_scale,
    merge_activation,
    merge_grad,
    param_grad_table,
    saturation_bounds,
    unit_activity,
    unit_dims,
)
from ._options import WatchOptions

__all__ = ["Recorder"]

ModuleHook = Callable[[nn.Module, Any, Any], None]


class Recorder:
    """Hooks on the selected modules and the device-side state they fill."""

    def __init__(
        self,
        modules: list[tuple[str, nn.Module]],
        params: list[tuple[str, nn.Parameter]],
        options: WatchOptions,
    ) -> None:
        self.options = options
        self.paths = [path for path, _ in modules]
        self.kinds = [type(m).__name__ for _, m in modules]
        self.module_refs = [weakref.ref(m) for _, m in modules]
        self.param_names = [name for name, _ in params]
        self.params: list[nn.Parameter] = [p for _, p in params]
        count = len(modules)
        self.bounds = [saturation_bounds(m) for _, m in modules]
        self.buffers = StepBuffers(options.buffer_steps, count, len(params), options.hist_bins)
        self.row = -1  # the id of the row the hooks write into now; -1 when this moment is not recorded
        self.open_row = -1  # the row id of the open step, also between its batches
        self.checking = False  # the open step is an unrecorded training step whose non-finite values are checked
        self.active = False  # inside a training batch
        self.observed = [False] * count
        self.forward_order: list[int] = []
        self.backward_order: list[int] = []
        self._ranked = ([False] * count, [False] * count)
        self.units: list[torch.Tensor | None] = [None] * count
        self.unit_values = [0] * count
        self.scales: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * count
        self.flags: torch.Tensor | None = None  # (2, modules) bool: all finite so far in this step (fwd, bwd)
        self.first: torch.Tensor | None = None  # (2, modules) int64: first unrecorded step found non-finite
        self.dropped: dict[str, int] = {}
        self._before: tuple[int, list[torch.Tensor]] | None = None
        self._handles: list[HookHandle] = []
        groups = options.groups
        self._stats, self._hist, self._units = (
            "activations" in groups,
            "histograms" in groups,
            "unit_activity" in groups,
        )
        self._grads = "output_grads" in groups

    def matches(self, modules: list[tuple[str, nn.Module]], params: list[tuple[str, nn.Parameter]]) -> bool:
        """Whether `modules` and `params` have the paths and names this recorder was built for."""
        return [p for p, _ in modules] == self.paths and [n for n, _ in params] == self.param_names

    def rebind(self, modules: list[tuple[str, nn.Module]], params: list[tuple[str, nn.Parameter]]) -> None:
        """Point at the modules and parameters of a new fit of the same model (same paths and names)."""
        self.module_refs = [weakref.ref(m) for _, m in modules]
        self.params = [p for _, p in params]
        self.bounds = [saturation_bounds(m) for _, m in modules]

    def register(self) -> None:
        """Place one forward hook on every selected module."""
        for index, (path, ref) in enumerate(zip(self.paths, self.module_refs, strict=True)):
            module = ref()
            if module is not None:
                hook = self._forward_hook(index)
                self._handles.append(register_module_hook(module, "forward", hook, owner=self, path=path, tags=_TAGS))

    def remove(self) -> None:
        """Remove the hooks and let go of the parameters; calling it again does nothing."""
        while self._handles:
            self._handles.pop().remove()
        self.params = []
        self._before = None

    def drop(self, reason: str, count: int = 1) -> None:
        """Count `count` observations not kept, by reason."""
        self.dropped[reason] = self.dropped.get(reason, 0) + count

    def _forward_hook(self, index: int) -> ModuleHook:
        ref = self.module_refs[index]

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if module is not ref():  # a deepcopy of the model shares the hooks; it is not watched
                return
            if self.row >= 0:
                self._record(index, module, output)
            elif self.checking and self.active:
                self._check(index, output)
            else:
                self.drop("sampling" if self.active else "eval" if not module.training else "outside_step")

        return hook

    def _rank(self, direction: int, index: int) -> None:
        ranked = self._ranked[direction]
        if not ranked[index]:
            ranked[index] = True
            (self.backward_order if direction else self.forward_order).append(index)

    def _record(self, index: int, module: nn.Module, output: Any) -> None:
        self.observed[index] = True
        self._rank(0, index)
        row, buffers = self.row, self.buffers
        x = first_float(output)
        if x is not None and x.numel():
            xf = x.detach()
            xf = xf if xf.dtype == torch.float32 else xf.float()
            buffers.allocate(xf.device)
            slot = row % buffers.rows
            count = buffers.counts[slot][index]
            if self._stats:
                values = activation_vector(xf, self.options.near_zero, self.bounds[index])
                target = buffers.module_view(slot, "activations", index)
                if count == 0:
                    target.copy_(values)
                else:
                    merge_activation(target, values, count, xf.numel())
            if self._hist:
                self._record_hist(index, slot, xf, count == 0)
            if self._units:
                self._record_units(index, module, xf)
            buffers.counts[slot][index] = count + xf.numel()
        if self._grads and torch.is_grad_enabled():
            self._hook_grads(output, self._grad_hook(index, row))

    def _record_hist(self, index: int, slot: int, xf: torch.Tensor, first: bool) -> None:
        scale_shift = self.scales[index]
        if scale_shift is None:
            scale_shift = self.scales[index] = hist_scale(xf, self.options.hist_bins, self.options.hist_range)
        counts = hist_counts(xf, *scale_shift, self.options.hist_bins)
        target = self.buffers.module_view(slot, "histograms", index)
        if first:
            target.copy_(counts)
        else:
            target.add_(counts)

    def _record_units(self, index: int, module: nn.Module, xf: torch.Tensor) -> None:
        dims = unit_dims(module, xf.dim())
        if dims is None:
            return
        unit, reduce = dims
        active = unit_activity(xf, reduce)
        total = self.units[index]
        if total is None:
            self.units[index] = active.to(torch.float32 if xf.device.type == "mps" else torch.float64)
        elif total.shape != active.shape:
            self.drop("unit_shape")
            return
        else:
            total.add_(active)
        self.unit_values[index] += xf.numel() // xf.shape[unit]

    @staticmethod
    def _hook_grads(output: Any, hook: Callable[[torch.Tensor], None]) -> None:
        # Ephemeral per-call hooks on the output tensors: they die with the graph, so they bypass the registry
        # (as hookscope.hooks.register_output_grad_hook does) and work when an in-place op follows the module.
        if type(output) is torch.Tensor:
            if output.requires_grad:
                output.register_hook(hook)  # type: ignore[no-untyped-call]
            return
        for _, tensor in tensor_leaves(output):
            if tensor.requires_grad:
                tensor.register_hook(hook)  # type: ignore[no-untyped-call]

    def _grad_hook(self, index: int, row: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            buffers = self.buffers
            if not buffers.is_live(row):
                self.drop("late_gradient")
                return
            self._rank(1, index)
            values = grad_vector(grad)
            slot = row % buffers.rows
            seen = buffers.grad_values[slot][index]
            target = buffers.module_view(slot, "output_grads", index)
            if seen == 0:
                target.copy_(values)
            else:
                merge_grad(target, values)
            buffers.grad_values[slot][index] = seen + grad.numel()

        return hook

    def _check(self, index: int, output: Any) -> None:
        self.drop("sampling")
        self.observed[index] = True
        self._rank(0, index)
        x = first_float(output)
        if x is None or not x.numel():
            return
        flags = self._flags(x.device)
        flags[0, index].logical_and_(torch.isfinite(x.detach()).all())
        if torch.is_grad_enabled():
            self._hook_grads(output, self._check_hook(index))

    def _check_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            self._rank(1, index)
            self._flags(grad.device)[1, index].logical_and_(torch.isfinite(grad).all())

        return hook

    def _flags(self, device: torch.device) -> torch.Tensor:
        if self.flags is None:
            self.flags = torch.ones(2, len(self.paths), dtype=torch.bool, device=device)
            self.first = torch.full((2, len(self.paths)), -1, dtype=torch.int64, device=device)
        return self.flags

    def fold_flags(self, step: int) -> None:
        """Fold the checked step's finite flags into the first non-finite steps, on the device; reset them."""
        if self.flags is None or self.first is None:
            return
        newly = ~self.flags & (self.first < 0)
        self.first.copy_(torch.where(newly, step, self.first))
        self.flags.fill_(True)

    def record_param_grads(self) -> None:
        """Write the norm and non-finite count of every watched parameter's `.grad` into the open row."""
        row = self.open_row
        if row < 0 or not self.params or "param_grads" not in self.options.groups:
            return
        present = [
            (i, p.grad) for i, p in enumerate(self.params) if p.grad is not None and p.grad.layout == torch.strided
        ]
        if not present:
            return
        grads = [g for _, g in present]
        self.buffers.allocate(grads[0].device)
        values = param_grad_table(grads)
        slot = row % self.buffers.rows
        table = self.buffers.tensors["param_grads"][slot]
        if len(present) == len(self.params):
            table.copy_(values)
        else:
            table.fill_(float("nan"))
            table[[i for i, _ in present]] = values
        self.buffers.param_seen[slot] = True

    def snapshot(self) -> None:
        """Copy the watched parameters before an optimizer step of a recorded step."""
        if self.open_row >= 0 and self.params and "update_ratios" in self.options.groups:
            with torch.no_grad():
                copies = torch._foreach_mul([p.detach() for p in self.params], 1.0)
            self._before = (self.open_row, list(copies))

    def record_ratios(self) -> None:
        """Write ||W_after - W_before|| / ||W_after|| of each watched parameter into the snapshot's row."""
        if self._before is None:
            return
        row, before = self._before
        self._before = None
        if not self.buffers.is_live(row) or not self.params:
            self.drop("late_update")
            return
        with torch.no_grad():
            after = [p.detach() for p in self.params]
            torch._foreach_sub_(before, after)
            moved = torch.stack(torch._foreach_norm(before, 2, dtype=torch.float32))
            size = torch.stack(torch._foreach_norm(after, 2, dtype=torch.float32))
        self.buffers.allocate(moved.device)
        slot = row % self.buffers.rows
        self.buffers.tensors["update_ratios"][slot].copy_(moved / size)
        self.buffers.ratio_seen[slot] = True

    def log_loss(self, loss: torch.Tensor | float) -> None:
        """Add `loss` to the open row's loss (averaged over the calls of the step); count it dropped otherwise."""
        row = self.open_row
        if row < 0:
            self.drop("sampling_loss")
            return
        value = loss.detach().float().mean() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))
        buffers = self.buffers
        buffers.allocate(value.device)
        slot = row % buffers.rows
        target = buffers.tensors["losses"][slot]
        if buffers.loss_calls[slot] == 0:
            target.copy_(value.reshape(()))
        else:
            target.add_(value.reshape(()))
        buffers.loss_calls[slot] += 1


_TAGS = ("watch",)
