"""The hooks of one attached watch and what they leave for the end of the step.

The forward hook of each selected module takes one of three paths, decided once per step by `Watch`: record
(the step is recorded), check (an unrecorded training step: only whether the output and its gradient are
finite) or skip (counted in `dropped`). Recording does little in the hook: the output is added to the step's row
in the engine's tables (`_buffers.py`), which describe a large output at once (while it is in cache and before an
in-place op can change it) and copy a small one; gradient hooks do the same. `settle()` at the end of the step
closes it; the small tensors of several closed steps are described together when the rows are written
(`_step.py`).

Under `torch.compile` the traced hooks read one flag and append to one list (no other Python state, so no graph
break and no recompilation per step); output gradients accumulate into a device tensor. `settle()` takes it
from there, so compiled and eager runs record the same statistics. Nothing here reads a device value back to the
host.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from ..hooks import HookHandle, register_module_hook, tensor_leaves
from ..stats import unit_dims
from ._buffers import StepBuffers
from ._inspect import first_float, saturation_bounds
from ._options import WatchOptions
from ._params import ParamRecorder

__all__ = ["Recorder"]

ModuleHook = Callable[[nn.Module, Any, Any], None]
GradHook = Callable[[Any], None]


class Recorder(ParamRecorder):
    """Hooks on the selected modules and the device-side state they fill."""

    def __init__(
        self,
        modules: list[tuple[str, nn.Module]],
        params: list[tuple[str, nn.Parameter]],
        options: WatchOptions,
    ) -> None:
        count = len(modules)
        self.module_refs = [weakref.ref(m) for _, m in modules]
        self.bounds = [saturation_bounds(m) for _, m in modules]
        buffers = StepBuffers(options, count, len(params), self.bounds, self._unit_dim)
        super().__init__(options, buffers, [p for _, p in params])
        self.paths = [path for path, _ in modules]
        self.kinds = [type(m).__name__ for _, m in modules]
        self.param_names = [name for name, _ in params]
        self.param_shapes = [tuple(p.shape) for _, p in params]  # what a loaded state must have been saved for
        self.row = -1  # the id of the row the hooks write into now; -1 when this moment is not recorded
        self.checking = False  # the open step is an unrecorded training step whose non-finite values are checked
        self.active = False  # inside a training batch
        self.recording = False  # row >= 0: the flag traced hooks read (a bool, so compiled code is reused)
        self.checking_now = False  # checking and active
        self.observed = [False] * count
        self.forward_order: list[int] = []
        self.backward_order: list[int] = []
        self._ranked = ([False] * count, [False] * count)
        self.flags: torch.Tensor | None = None  # (2, modules) bool, kept for state dicts
        self.first: torch.Tensor | None = None  # (2, modules) int64: first unrecorded step found non-finite
        self.dropped: dict[str, int] = {}
        self.checks: list[tuple[int, int, tuple[torch.Tensor, torch.Tensor]]] = []
        self.traced: list[tuple[int, int, torch.Tensor]] = []  # (kind, module, tensor) appended by traced hooks
        self.stage: torch.Tensor | None = None  # (modules, 3 + 1) gradient sums and check hits of traced backwards
        self._handles: list[HookHandle] = []
        self._positions: dict[tuple[torch.device, tuple[int, ...]], torch.Tensor] = {}
        groups = options.groups
        self._stats, self._hist = "activations" in groups, "histograms" in groups
        self._units, self._grads = "unit_activity" in groups, "output_grads" in groups
        self._capture = self._stats or self._hist or self._units
        self._traced_grad_hooks = [self._traced_grad_hook(j) for j in range(count)]
        self._traced_check_hooks = [self._traced_check_hook(j) for j in range(count)]

    def matches(self, modules: list[tuple[str, nn.Module]], params: list[tuple[str, nn.Parameter]]) -> bool:
        """Whether `modules` and `params` have the paths and names this recorder was built for."""
        return [p for p, _ in modules] == self.paths and [n for n, _ in params] == self.param_names

    def rebind(self, modules: list[tuple[str, nn.Module]], params: list[tuple[str, nn.Parameter]]) -> None:
        """Point at the modules and parameters of a new fit of the same model (same paths and names)."""
        self.module_refs = [weakref.ref(m) for _, m in modules]
        self.bind_params([p for _, p in params])
        self.param_shapes = [tuple(p.shape) for _, p in params]

    def _unit_dim(self, index: int, ndim: int) -> int | None:
        """The unit dim of an `ndim`-dim output of module `index` (`None`: no units)."""
        dims = unit_dims(self.module_refs[index](), ndim)
        return None if dims is None else dims[0]

    def positions(self, columns: list[int], device: torch.device) -> torch.Tensor:
        """A cached int64 device tensor of `columns`."""
        key = (device, tuple(columns))
        tensor = self._positions.get(key)
        if tensor is None:
            if len(self._positions) >= 256:
                self._positions.clear()
            tensor = self._positions[key] = torch.tensor(columns, dtype=torch.int64).to(device)
        return tensor

    def register(self) -> None:
        """Place one forward hook on every selected module."""
        self.stage = None
        for index, (path, ref) in enumerate(zip(self.paths, self.module_refs, strict=True)):
            module = ref()
            if module is not None:
                if self.stage is None:
                    self.stage = torch.zeros(len(self.paths), 4, device=_device_of(module))
                hook = self._forward_hook(index)
                self._handles.append(register_module_hook(module, "forward", hook, owner=self, path=path, tags=_TAGS))

    def remove(self) -> None:
        """Remove the hooks and let go of the parameters and buffers; calling it again does nothing."""
        while self._handles:
            self._handles.pop().remove()
        self.bind_params([])
        self._positions.clear()

    def drop(self, reason: str, count: int = 1) -> None:
        """Count `count` observations not kept, by reason."""
        self.dropped[reason] = self.dropped.get(reason, 0) + count

    def enter_batch(self, row: int) -> None:
        """A training batch of the open step begins: record into `row` (-1: check or skip)."""
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
            elif module is not ref():  # a deepcopy of the model shares the hooks; it is not watched
                return
            elif self.row >= 0:
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
        row = self.row
        x = first_float(output) if self._capture else None
        if x is not None and x.numel():
            self.observe_activation(row, index, x.detach())
        if self._grads and torch.is_grad_enabled():
            _hook_grads(output, self._grad_hook(index, row))

    def _traced_forward(self, index: int, output: Any) -> None:
        # Traced by torch.compile: read one flag, append to one list, register gradient hooks; nothing else.
        x = first_float(output)
        if x is None or x.numel() == 0:
            return
        if self.recording:
            if self._capture:
                self.traced.append((0, index, x.detach().to(torch.float32, copy=True)))
            if self._grads and torch.is_grad_enabled():
                _hook_grads(output, self._traced_grad_hooks[index])
        elif self.checking_now:
            self.traced.append((-1, index, torch.stack(torch.aminmax(x.detach()))))
            if torch.is_grad_enabled():
                _hook_grads(output, self._traced_check_hooks[index])

    # ---- gradients -----------------------------------------------------------------------------------------
    def _grad_hook(self, index: int, row: int) -> GradHook:
        def hook(grad: torch.Tensor | None) -> None:
            if grad is None:
                return
            if self.buffers.is_live(row):
                self._rank(1, index)
            self.observe_grad(row, index, grad.detach() if grad.requires_grad else grad)

        return hook

    def _traced_grad_hook(self, index: int) -> GradHook:
        def hook(grad: torch.Tensor) -> None:
            # Traced into the backward graph: only in-place updates of a device tensor are allowed here.
            if self.stage is not None:
                self.stage[index, :3].add_(_squares(grad))

        return hook

    def _traced_check_hook(self, index: int) -> GradHook:
        def hook(grad: torch.Tensor) -> None:
            if self.stage is not None:
                hit = ~torch.isfinite(torch.stack(torch.aminmax(grad))).all()
                self.stage[index, 3].add_(hit.to(self.stage.dtype))

        return hook

    # ---- unrecorded steps: non-finite checks ---------------------------------------------------------------
    def _check(self, index: int, output: Any) -> None:
        self.drop("sampling")
        self.observed[index] = True
        self._rank(0, index)
        x = first_float(output)
        if x is None or not x.numel():
            return
        self.checks.append((0, index, torch.aminmax(x.detach())))
        if torch.is_grad_enabled():
            _hook_grads(output, self._check_hook(index))

    def _check_hook(self, index: int) -> GradHook:
        def hook(grad: torch.Tensor) -> None:
            self._rank(1, index)
            self.checks.append((1, index, torch.aminmax(grad)))

        return hook

    # ---- parameters and optimizer steps --------------------------------------------------------------------
    # ---- the end of a step ---------------------------------------------------------------------------------
    def fold_flags(self, step: int) -> None:
        """Fold the checked step's non-finite findings into the first non-finite steps, on the device."""
        found: list[tuple[int, int, tuple[torch.Tensor, ...]]] = [(d, j, tuple(pair)) for d, j, pair in self.checks]
        self.checks = []
        traced = [(0, j, tuple(t.unbind())) for kind, j, t in self._take_traced() if kind == -1]
        for _, j, _ in traced:
            self.observed[j] = True
            self._rank(0, j)
        if traced:
            self._assume_backward_order()
        found += traced
        stage = self.stage if traced else None
        if not found:
            return
        device = found[0][2][0].device
        hits = torch.zeros(2 * len(self.paths), device=device)
        bad = ~torch.isfinite(torch.stack([v for _, _, pair in found for v in pair]).view(-1, 2)).all(1)
        hits.index_add_(0, self.positions([d * len(self.paths) + j for d, j, _ in found], device), bad.float())
        if stage is not None:
            hits[len(self.paths) :].add_(stage[:, 3].to(device))
            stage[:, 3].zero_()
        self._ensure_flags(device)
        if self.first is not None:
            newly = (hits.view(2, -1) > 0) & (self.first < 0)
            self.first.copy_(torch.where(newly, step, self.first))

    def _ensure_flags(self, device: torch.device) -> None:
        if self.flags is None or self.first is None:
            self.flags = torch.ones(2, len(self.paths), dtype=torch.bool, device=device)
            self.first = torch.full((2, len(self.paths)), -1, dtype=torch.int64, device=device)

    def settle(self) -> None:
        """Close the recorded step: what traced hooks handed over joins its row; the rows wait (`_step.py`)."""
        row = self.open_row
        if row < 0:
            return
        traced = False
        for kind, index, tensor in self._take_traced():
            self.observed[index] = True
            self._rank(0, index)
            traced = True
            if kind == 0:
                self.observe_activation(row, index, tensor, owned=True)
        if traced:
            self._assume_backward_order()
            self._take_stage(row)
        self.close_step()

    def _take_stage(self, row: int) -> None:
        """Add the output-gradient sums of squares that compiled backwards accumulated to `row` (then zero them)."""
        stage = self.stage
        if stage is None or not self.buffers.is_live(row):
            return
        sums = stage[:, :3].double()
        norms = torch.stack((sums[:, 0].sqrt(), sums[:, 1], sums[:, 2], torch.zeros_like(sums[:, 0])), dim=1)
        slot = self._ready(row, stage.device)
        for index in range(len(self.paths)):
            self.buffers.grads.add_record(slot, index, norms[index])
        stage[:, :3].zero_()

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


def _squares(grad: torch.Tensor) -> torch.Tensor:
    """(sum of squares of the finite values, non-finite count, count) of `grad`, float32 (traced backwards)."""
    values = torch.view_as_real(grad) if grad.is_complex() else grad
    finite = torch.isfinite(values)
    clean = torch.where(finite, values, 0.0).float()
    return torch.stack(((clean * clean).sum(), (~finite).sum().float(), torch.full_like(clean.sum(), values.numel())))


def _hook_grads(output: Any, hook: GradHook) -> None:
    # Ephemeral per-call hooks on the output tensors: they die with the graph, so they bypass the registry (as
    # hookscope.hooks.register_output_grad_hook does) and work when an in-place op follows the module.
    if type(output) is torch.Tensor:
        _hook_grad(output, hook)
        return
    for _, tensor in tensor_leaves(output):
        _hook_grad(tensor, hook)


def _hook_grad(tensor: torch.Tensor, hook: GradHook) -> None:
    """Call `hook(grad)` with the gradient of `tensor`: a pre-hook on the node that made it (half the cost of
    `Tensor.register_hook`, same gradient: the one w.r.t. this version of the tensor), a tensor hook for leaves
    and under `torch.compile`."""
    if not tensor.requires_grad:
        return
    if torch.compiler.is_compiling() or tensor.grad_fn is None:
        tensor.register_hook(hook)  # type: ignore[no-untyped-call]
        return
    node = tensor.grad_fn
    slot = tensor.output_nr

    def prehook(grads: tuple[torch.Tensor | None, ...]) -> None:
        hook(grads[slot])

    node.register_prehook(prehook)


def _device_of(module: nn.Module) -> torch.device:
    for parameter in module.parameters():
        return parameter.device
    for buffer in module.buffers():
        return buffer.device
    return torch.device("cpu")


_TAGS = ("watch",)
