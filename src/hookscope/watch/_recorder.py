"""The hooks of one attached watch and what they leave for the end of the step.

The forward hook of each selected module first asks the step rule (`hookscope.callbacks._steps`) whether its call
belongs to a training step: calls inside a root forward that is not training (no_grad, inference_mode, eval) or
that is a recomputation (checkpoint) are counted in `dropped`, and what a root forward records is staged in its
`Frame` and kept only when that forward completes. Then one of three paths, decided once per step by `Watch`:
record (the step is recorded), check (an unrecorded training step: only whether the output and its gradient are
finite) or skip (counted in `dropped`). Hooks run one at a time (the watch's lock: forwards from several
threads), and a failure inside them is handed to the watch's `HookErrors` (counted, warned once, or raised when
strict). Recording does little in the hook: a large output gets its statistics at once (`_kernels.py`, while it
is in cache and before an in-place op can change it), a small one is copied into the step's `StepLog`; gradient
hooks do the same. `settle()` at the end of the step closes the log; the small tensors of several closed steps
are described together (`_batch.py`) when they are written into their rows (`_step.py`).

Under `torch.compile` the traced hooks read one flag and append to one list (no other Python state, so no graph
break and no recompilation per step); output gradients accumulate into a device tensor. `settle()` takes it
from there, so compiled and eager runs record the same statistics. Nothing here reads a device value back to the
host.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from ..callbacks._steps import ForwardFrames, Frame, uncounted
from ..hooks import HookErrors, HookHandle, is_plain, register_module_hook
from ..hooks._calls import CalledHook
from ._buffers import ACTIVATION, OUTPUT_GRAD, StepBuffers
from ._checks import NonFiniteChecks
from ._entry import GradHook, Staged, hook_grads, no_label, plain_grad, staged
from ._kernels import (
    BATCH_BELOW,
    Scratch,
    activation_vector,
    first_float,
    grad_vector,
    hist_counts,
    hist_scale,
    saturation_bounds,
    unit_activity,
    unit_dims,
)
from ._options import WatchOptions
from ._params import ParamRecorder
from ._step import StepLog

__all__ = ["Recorder"]

ModuleHook = Callable[[nn.Module, Any, Any], None]


class Recorder(NonFiniteChecks, ParamRecorder):
    """Hooks on the selected modules and the device-side state they fill."""

    def __init__(
        self,
        modules: list[tuple[str, nn.Module]],
        params: list[tuple[str, nn.Parameter]],
        options: WatchOptions,
    ) -> None:
        count = len(modules)
        buffers = StepBuffers(options.buffer_steps, count, len(params), options.hist_bins)
        super().__init__(options, buffers, [p for _, p in params])
        self.paths = [path for path, _ in modules]
        self.kinds = [type(m).__name__ for _, m in modules]
        self.module_refs = [weakref.ref(m) for _, m in modules]
        self.param_names = [name for name, _ in params]
        self.bounds = [saturation_bounds(m) for _, m in modules]
        self.row = -1  # traced hooks: the row of the training batch running now; -1 when it is not recorded
        self.checking = False  # the open step is an unrecorded training step whose non-finite values are checked
        self.step_open = False  # a step is open (recorded, checked or skipped by sampling)
        self.active = False  # inside a training batch (the flags traced hooks read follow it)
        self.recording = False  # row >= 0: the flag traced hooks read (a bool, so compiled code is reused)
        self.checking_now = False  # checking and active
        self.observed = [False] * count
        self.forward_order: list[int] = []
        self.backward_order: list[int] = []
        self._ranked = ([False] * count, [False] * count)
        self.unit_values = [0] * count
        self.flags: torch.Tensor | None = None  # (2, modules) bool, kept for state dicts
        self.first: torch.Tensor | None = None  # (2, modules) int64: first unrecorded step found non-finite
        self.dropped: dict[str, int] = {}
        self.scratch = Scratch()
        self.checks: list[tuple[int, int, tuple[torch.Tensor, torch.Tensor]]] = []
        self.traced: list[tuple[int, int, torch.Tensor]] = []  # (kind, module, tensor) appended by traced hooks
        self.stage: torch.Tensor | None = None  # (modules, 3 + 1) gradient sums and check hits of traced backwards
        self._handles: list[HookHandle] = []
        groups = options.groups
        self._stats, self._hist = "activations" in groups, "histograms" in groups
        self._units, self._grads = "unit_activity" in groups, "output_grads" in groups
        self._capture = self._stats or self._hist or self._units
        self._traced_grad_hooks = [self._traced_grad_hook(j) for j in range(count)]
        self._traced_check_hooks = [self._traced_check_hook(j) for j in range(count)]
        self.lock: threading.RLock = threading.RLock()  # the watch's: hooks and events run one at a time
        self.errors: HookErrors | None = None  # the watch's: where failures of these hooks go
        self.frames: ForwardFrames | None = None  # the root forwards running, per thread
        self.label: Callable[[str], None] = no_label  # label the open step (`"retain_graph"`)
        self.grad_where = [f"output-gradient hook on {path!r}" for path in self.paths]

    def matches(self, modules: list[tuple[str, nn.Module]], params: list[tuple[str, nn.Parameter]]) -> bool:
        """Whether `modules` and `params` have the paths and names this recorder was built for."""
        return [p for p, _ in modules] == self.paths and [n for n, _ in params] == self.param_names

    def rebind(self, modules: list[tuple[str, nn.Module]], params: list[tuple[str, nn.Parameter]]) -> None:
        """Point at the modules and parameters of a new fit of the same model (same paths and names)."""
        self.module_refs = [weakref.ref(m) for _, m in modules]
        self.bind_params([p for _, p in params])
        self.bounds = [saturation_bounds(m) for _, m in modules]
        self.forget_layouts()

    def register(self) -> None:
        """Place one forward hook on every selected module."""
        self.stage = None
        for index, (path, ref) in enumerate(zip(self.paths, self.module_refs, strict=True)):
            module = ref()
            if module is not None:
                if self.stage is None:
                    self.stage = torch.zeros(len(self.paths), 4, device=_device_of(module))
                hook = self._forward_hook(index)
                handle = register_module_hook(
                    module, "forward", hook, owner=self, path=path, tags=_TAGS, errors=self.errors
                )
                self._handles.append(handle)

    def remove(self) -> None:
        """Remove the hooks and let go of the parameters and buffers; calling it again does nothing."""
        while self._handles:
            self._handles.pop().remove()
        self.bind_params([])
        self.scratch.clear()
        self.forget_layouts()

    def drop(self, reason: str, count: int = 1) -> None:
        """Count `count` observations not kept, by reason."""
        self.dropped[reason] = self.dropped.get(reason, 0) + count

    def enter_batch(self, row: int) -> None:
        """A training batch of the open step begins: traced hooks record into `row` (-1: check or skip)."""
        self.active, self.row = True, row
        self.recording, self.checking_now = row >= 0, row < 0 and self.checking

    def leave_batch(self) -> None:
        """The training batch ended: forwards are not recorded until the next one."""
        self.active, self.row, self.recording, self.checking_now = False, -1, False, False

    # ---- forward -------------------------------------------------------------------------------------------
    def _forward_hook(self, index: int) -> ModuleHook:
        ref = self.module_refs[index]

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if torch.compiler.is_compiling():
                self._traced_forward(index, output)
            elif module is ref():  # not a deepcopy of the model sharing the hooks: it is not watched
                with self.lock:
                    self._on_output(index, module, output)

        return hook

    def _on_output(self, index: int, module: nn.Module, output: Any) -> None:
        """Apply the step rule to one call of module `index`, then record, check or skip it."""
        frame = self.frames.current() if self.frames is not None else None
        reason = uncounted(module, self.options.train_only) if frame is None else frame.reason
        if reason == "recompute":  # counted once: only its output gradients, which the first pass may lack
            self.drop("recompute")
            if self.open_row >= 0 and self.log is not None and self._grads and torch.is_grad_enabled():
                hook_grads(output, self._grad_hook(index, self.log), self._repeated)
            return
        if reason is not None:
            self.drop(reason)
        elif self.open_row >= 0:
            self._record(index, module, output, staged(frame))
        elif self.checking:
            self._check(index, output, staged(frame))
        else:
            self.drop("sampling" if self.step_open else "outside_step")

    def commit(self, frame: Frame, completed: bool) -> None:
        """A root forward ended: keep what its hooks staged if it completed, else count it in `dropped`."""
        if not frame.items:
            return
        staged: Staged = frame.items[0]
        if not completed:
            self.drop("raised", staged.calls)
            return
        log = self.log
        if staged.log.values or staged.log.acts or any(staged.log.small):
            if log is None:
                self.drop("outside_step", staged.calls)
                return
            for kind, entries in enumerate(staged.log.small):
                log.small[kind].extend(entries)
            log.acts.extend(staged.log.acts)
            log.values += staged.log.values
        self.checks.extend(staged.checks)
        table = self.unit_table.flat
        for start, active, index, per_unit in staged.units:
            if table is not None:
                table[start : start + active.numel()].add_(active)
                self.unit_values[index] += per_unit

    def _rank(self, direction: int, index: int) -> None:
        ranked = self._ranked[direction]
        if not ranked[index]:
            ranked[index] = True
            (self.backward_order if direction else self.forward_order).append(index)

    def _record(self, index: int, module: nn.Module, output: Any, staged: Staged | None) -> None:
        self.observed[index] = True
        self._rank(0, index)
        log, target = self.log, (self.log if staged is None else staged.log)
        if staged is not None:
            staged.calls += 1
        x = first_float(output) if self._capture else None
        if x is not None and not is_plain(x):
            self.drop("unsupported_layout")
            x = None
        if x is not None and x.numel() and target is not None:
            if x.is_inference():  # inference tensors have no version counter: keep an owned copy
                self.keep_owned(target, ACTIVATION, index, x.to(torch.float32, copy=True).reshape(x.shape))
            elif x.numel() < BATCH_BELOW:
                self.keep_small(target, ACTIVATION, index, x.detach())
            else:
                self.describe_large(target, index, x.detach(), module, staged)
        if self._grads and torch.is_grad_enabled() and log is not None:
            hook_grads(output, self._grad_hook(index, log), self._repeated)

    def _repeated(self) -> None:
        """A backward went through an output a second time (`retain_graph=True`): keep the first, label the step."""
        with self.lock:
            self.drop("retain_graph")
            self.label("retain_graph")

    def describe_large(
        self, log: StepLog, index: int, x: torch.Tensor, module: nn.Module | None, staged: Staged | None = None
    ) -> None:
        """Take the statistics of a large output `x` of module `index` now (in cache, before in-place ops); unit
        activity waits in `staged` until its forward completes, when given."""
        flat = x.reshape(-1) if x.dtype == torch.float32 else x.reshape(-1).float()
        vector = activation_vector(flat, self.options.near_zero, self.bounds[index], self.scratch)
        hist = None
        if self._hist:
            scale, shift = self._scale_of(index, flat)
            hist = hist_counts(flat, scale, shift, self.options.hist_bins, self.scratch)
        if self._units and module is not None:
            dims = unit_dims(module, x.dim())
            if dims is not None:
                self._add_units(index, x.shape, dims, flat, staged)
        log.acts.append((index, flat.numel(), vector, hist))

    def _scale_of(self, index: int, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state = self.hist_state(flat.device)
        if not state.ready[index] and self.pending:
            self.write_pending()  # the range comes from the module's first recorded step
        if not state.ready[index]:
            scale, shift = hist_scale(flat, self.options.hist_bins, self.options.hist_range)
            state.scale[index].copy_(scale)
            state.shift[index].copy_(shift)
            state.ready[index] = True
        return state.scale[index], state.shift[index]

    def _add_units(
        self,
        index: int,
        shape: torch.Size,
        dims: tuple[int, tuple[int, ...]],
        flat: torch.Tensor,
        staged: Staged | None = None,
    ) -> None:
        unit, reduce = dims
        start = self.unit_table.slot(index, shape[unit], flat.device)
        if start is None:
            self.drop("unit_shape")
            return
        active = unit_activity(flat.view(shape), reduce, self.scratch)
        if staged is not None:
            staged.units.append((start, active.clone(), index, flat.numel() // shape[unit]))
            return
        table = self.unit_table.flat
        if table is not None:
            table[start : start + shape[unit]].add_(active)
        self.unit_values[index] += flat.numel() // shape[unit]

    def _traced_forward(self, index: int, output: Any) -> None:
        # Traced by torch.compile: read one flag, append to one list, register gradient hooks; nothing else.
        x = first_float(output)
        if x is None or x.numel() == 0:
            return
        if self.recording:
            if self._capture:
                self.traced.append((ACTIVATION, index, x.detach().to(torch.float32, copy=True)))
            if self._grads and torch.is_grad_enabled():
                hook_grads(output, self._traced_grad_hooks[index])
        elif self.checking_now:
            self.traced.append((-1, index, torch.stack(torch.aminmax(x.detach()))))
            if torch.is_grad_enabled():
                hook_grads(output, self._traced_check_hooks[index])

    # ---- gradients -----------------------------------------------------------------------------------------
    def _grad_hook(self, index: int, log: StepLog) -> GradHook:
        def hook(grad: torch.Tensor | None) -> None:
            if grad is not None:
                with self.lock:
                    self._on_grad(index, log, grad)

        return CalledHook(hook, self.errors, self.grad_where[index])

    def _on_grad(self, index: int, log: StepLog, raw: torch.Tensor) -> None:
        grad = plain_grad(raw)
        if grad is None:
            self.drop("unsupported_layout")
            return
        if log.written:
            self.late_gradient(log, index, grad)
            return
        self._rank(1, index)
        if grad.numel() < BATCH_BELOW:
            self.keep_small(log, OUTPUT_GRAD, index, grad.detach() if grad.requires_grad else grad)
        else:
            log.grads.append((index, grad_vector(grad.detach())))

    def _traced_grad_hook(self, index: int) -> GradHook:
        def hook(grad: torch.Tensor) -> None:
            # Traced into the backward graph: only in-place updates of a device tensor are allowed here.
            if self.stage is not None:
                self.stage[index, :3].add_(grad_vector(grad))

        return hook

    # ---- parameters and optimizer steps --------------------------------------------------------------------
    def log_loss(self, loss: torch.Tensor | float) -> None:
        """Add `loss` to the open row's loss (averaged over the calls of the step); count it dropped otherwise."""
        row_id = self.open_row
        if row_id < 0:
            self.drop("sampling_loss")
            return
        value = loss.detach().float().mean() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))
        at = self.buffers.layout.loss_at
        row = self.buffers.row(row_id, value.device)
        row[at : at + 1].add_(value.reshape(1).to(row.device))
        self.buffers.loss_calls[row_id % self.buffers.rows] += 1

    # ---- the end of a step ---------------------------------------------------------------------------------
    def settle(self) -> None:
        """Close the recorded step: its log waits to be written with the next ones (`_step.py`)."""
        log = self.log
        if log is None or log.settled:
            return
        for kind, index, tensor in self._take_traced():
            self.observed[index] = True
            self._rank(0, index)
            log.traced = True
            if kind != ACTIVATION:
                continue
            if tensor.numel() < BATCH_BELOW:
                self.keep_owned(log, ACTIVATION, index, tensor)
            else:
                self.describe_large(log, index, tensor, self.module_refs[index]())
        if log.traced:
            self._assume_backward_order()
        self.defer(log)

    def _assume_backward_order(self) -> None:
        """Compiled backwards cannot report their order: assume the reverse of the forward order."""
        for index in reversed(self.forward_order):
            self._rank(1, index)

    def _take_traced(self) -> list[tuple[int, int, torch.Tensor]]:
        traced, self.traced = self.traced, []
        return traced

    def modules(self) -> list[nn.Module | None]:
        """The watched modules (`None` for those deleted)."""
        return [ref() for ref in self.module_refs]


def _device_of(module: nn.Module) -> torch.device:
    for parameter in module.parameters():
        return parameter.device
    for buffer in module.buffers():
        return buffer.device
    return torch.device("cpu")


_TAGS = ("watch",)
