"""The hooks of one attached watch and what they leave for the end of the step.

The forward hook of each selected module first asks the step rule (`hookscope.callbacks._steps`) whether its call
belongs to a training step: calls inside a root forward that is not training (no_grad, inference_mode, eval) or
that is a recomputation (checkpoint) are counted in `dropped`, and what a root forward records is staged in its
`Frame` and kept only when that forward completes. Then one of three paths, decided once per step by `Watch`:
record (the step is recorded), check (an unrecorded training step: only whether the output and its gradient are
finite) or skip (counted in `dropped`). Hooks run one at a time (the watch's lock: forwards from several
threads), and a failure inside them is handed to the watch's `HookErrors` (counted, warned once, or raised when
strict). Recording does little in the hook: the output is read by the engine's activation table (a `RecordTable`,
`hookscope.stats._tables`, one of the step rows of `_buffers.py`), which describes a large output at once (while
it is in cache and before an in-place op can change it) and copies a small one; gradient hooks do the same.
`settle()` at the end of the step closes it; the small tensors of several closed steps are described together
when the rows are written (`_buffers.py`'s `close_step`).

The path of a value: here (the forward hook: `_on_output` -> `_record` -> `RecordTable.stage`, kept by `commit`
when the root forward completes) -> `hookscope.stats._tables` (copied, then described and written into its row
when the rows are written) -> `_buffers.py` (`StepBuffers.take`: the rows to the host, finalized) -> `_store.py`
(kept) -> `_assemble.py` (`WatchResults`).

Under `torch.compile` the traced hooks read one flag and append to one list (no other Python state, so no graph
break and no recompilation per step); output gradients accumulate into a device tensor. `settle()` takes it
from there, so compiled and eager runs record the same statistics. Nothing here reads a device value back to the
host.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn as nn

from .._torch import is_view
from .._transfer import to_device
from ..callbacks._budget import Budget
from ..callbacks._steps import ForwardFrames, Frame, uncounted
from ..hooks import HookHandle, register_module_hook
from ..hooks._calls import CalledHook, HookErrors
from ..hooks._tree import first_float, is_plain
from ..results._nonfinite import UNPLACED
from ..stats._norms import combine_norms, norm_of
from ..stats._tables import RecordTable
from ..stats._units import unit_dims
from ._attention import AttentionRecorder
from ._buffers import StepBuffers
from ._call_log import CallLog, checked
from ._entry import Check, GradHook, Staged, hook_grads, no_label, plain_grad, staged
from ._inspect import saturation_bounds
from ._options import WatchOptions
from ._params import ParamRecorder
from ._residual import ResidualRecorder
from ._step import StepState

__all__ = ["Recorder"]

ModuleHook = Callable[[nn.Module, Any, Any], None]


class Recorder:
    """Hooks on the selected modules and the device-side rows they fill, for the open step of `state`.

    Args:
        modules: The selected modules, with their paths.
        params: The watched parameters, with their names (their statistics: `params`, a `ParamRecorder`).
        options: The watch's options.
        state: The watch's step state, written by its `Stepper` and read here.
        budget: Where the time of these hooks is counted (hookscope's own cost).
        blocks: The repeated blocks whose residual stream is recorded (`_residual.py`), with their paths.
    """

    def __init__(
        self,
        modules: list[tuple[str, nn.Module]],
        params: list[tuple[str, nn.Parameter]],
        options: WatchOptions,
        state: StepState,
        budget: Budget,
        blocks: list[tuple[str, nn.Module]] | None = None,
    ) -> None:
        count = len(modules)
        blocks = blocks or []
        self.options = options
        self.state = state
        self.budget = budget
        self.module_refs = [weakref.ref(m) for _, m in modules]
        self.bounds = [saturation_bounds(m) for _, m in modules]
        sizes = [p.numel() for _, p in params]
        self.buffers = StepBuffers(
            options, count, len(params), self.bounds, self._unit_dim, blocks=len(blocks), param_sizes=sizes
        )
        self.params = ParamRecorder(options, self.buffers, [p for _, p in params], state, self.drop)
        self.residual = ResidualRecorder(blocks, self.buffers.residual, state, options.train_only)
        self.attention = AttentionRecorder(self.buffers.attention, self.buffers, state, options.train_only, self.drop)
        self.paths = [path for path, _ in modules]
        self.kinds = [type(m).__name__ for _, m in modules]
        self.param_names = [name for name, _ in params]
        self.param_shapes = [tuple(p.shape) for _, p in params]  # what a loaded state must have been saved for
        self.observed = [False] * count
        self.call_log = CallLog(count)  # the call order of a step, and which call of a shared module went non-finite
        self.forward_order: list[int] = []
        self.backward_order: list[int] = []
        self._ranked = ([False] * count, [False] * count)
        self.flags: torch.Tensor | None = None  # (2, modules) bool, kept for state dicts
        self.first: torch.Tensor | None = None  # (2, modules) int64: first unrecorded step found non-finite
        self.first_place: torch.Tensor | None = None  # (modules,) int64: where in a forward it was, that step
        self.dropped: dict[str, int] = {}
        self.checks: list[Check] = []
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
        self.lock: threading.RLock = threading.RLock()  # the watch's: hooks and events run one at a time
        self.errors: HookErrors | None = None  # the watch's: where failures of these hooks go
        self.frames: ForwardFrames | None = None  # the root forwards running, per thread
        self.label: Callable[[str], None] = no_label  # label the open step (`"retain_graph"`)
        self.grad_where = [f"output-gradient hook on {path!r}" for path in self.paths]
        self._grad_hooks = [self._make_grad_hook(j) for j in range(count)]  # made again by `register` (errors)
        self._paused: list[HookHandle] = []  # the hooks `set_awake(False)` took off, to put back
        self.is_traced = False  # a hook was traced by torch.compile: the hooks stay on

    def matches(
        self,
        modules: list[tuple[str, nn.Module]],
        params: list[tuple[str, nn.Parameter]],
        blocks: list[tuple[str, nn.Module]] | None = None,
    ) -> bool:
        """Whether `modules`, `params` and `blocks` have the paths and names this recorder was built for."""
        same_blocks = [p for p, _ in blocks or []] == self.residual.paths
        return [p for p, _ in modules] == self.paths and [n for n, _ in params] == self.param_names and same_blocks

    def rebind(
        self,
        modules: list[tuple[str, nn.Module]],
        params: list[tuple[str, nn.Parameter]],
        blocks: list[tuple[str, nn.Module]] | None = None,
    ) -> None:
        """Point at the modules and parameters of a new fit of the same model (same paths and names)."""
        self.module_refs = [weakref.ref(m) for _, m in modules]
        self.residual.bind([b for b in blocks or [] if b[0] in self.residual.paths])
        self.params.bind([p for _, p in params])
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
            tensor = self._positions[key] = to_device(torch.tensor(columns, dtype=torch.int64), device)
        return tensor

    def register(self, model: nn.Module | None = None) -> None:
        """Place one forward hook on every selected module, and those of the residual stream and of attention
        (found in `model`, the root)."""
        for part in (self.residual, self.attention):
            part.lock, part.errors, part.frames = self.lock, self.errors, self.frames
        if "residual" in self.options.groups:
            self.residual.register()
        if model is not None and "attention" in self.options.groups:
            self.attention.register(model)
        self.stage = None
        self._paused = []
        self._grad_hooks = [self._make_grad_hook(j) for j in range(len(self.paths))]  # they hand failures to errors
        for index, (path, ref) in enumerate(zip(self.paths, self.module_refs, strict=True)):
            module = ref()
            if module is not None:
                if self.stage is None:
                    self.stage = torch.zeros(len(self.paths), 4, dtype=torch.float64, device=_device_of(module))
                hook = self._forward_hook(index)
                handle = register_module_hook(
                    module, "forward", hook, owner=self, path=path, tags=_TAGS, errors=self.errors
                )
                self._handles.append(handle)

    def set_awake(self, awake: bool, *, root: bool = False) -> None:
        """Put the paused hooks back on the modules (`awake`), or take the per-module hooks off for a step neither
        measured nor checked (with `root`, the attention hooks on the root too: call it outside a forward then). A
        module without hooks runs torch's fast path, so such a step costs nothing per module; the hooks stay
        registered (paused). A model traced by `torch.compile` keeps them: its graph holds the hooks it was traced
        with, and one traced while they are off would never record."""
        if awake:
            paused, self._paused = self._paused, []
            for handle in paused:
                handle.resume()
        elif not self.is_traced:
            hooks = (*self._handles, *self.residual.pausable(), *self.attention.pausable(root))
            for handle in hooks:
                if not handle.is_paused:
                    handle.pause()
                    self._paused.append(handle)

    @property
    def is_awake(self) -> bool:
        """Whether every hook of this recorder is on its module (none paused by `set_awake`)."""
        return not self._paused

    def remove(self) -> None:
        """Remove the hooks and let go of the parameters and buffers; calling it again does nothing."""
        self._paused = []
        while self._handles:
            self._handles.pop().remove()
        self.residual.remove()
        self.attention.remove()
        self.params.bind([])
        self._positions.clear()

    def drop(self, reason: str, count: int = 1) -> None:
        """Count `count` observations not kept, by reason."""
        self.dropped[reason] = self.dropped.get(reason, 0) + count

    # ---- forward -------------------------------------------------------------------------------------------
    def _forward_hook(self, index: int) -> ModuleHook:
        ref = self.module_refs[index]

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if torch.compiler.is_compiling():
                self._traced_forward(index, output)
            elif module is not ref():  # a deepcopy of the model sharing the hooks: it is not watched
                return
            elif self.state.skipping:  # a step neither measured nor checked: counted, nothing else
                with self.lock:
                    self.drop("sampling")
            else:
                start = time.perf_counter()
                with self.lock:
                    if torch.is_inference_mode_enabled():
                        with _normal_tensors():
                            self._on_output(index, module, output)
                    else:
                        self._on_output(index, module, output)
                self.budget.add_own(time.perf_counter() - start)

        return hook

    def _on_output(self, index: int, module: nn.Module, output: Any) -> None:
        """Apply the step rule to one call of module `index`, then record, check or skip it."""
        frame = self.frames.current() if self.frames is not None else None
        reason = uncounted(module, self.options.train_only) if frame is None else frame.reason
        state = self.state
        row = state.row
        if reason == "recompute":  # counted once: only its output gradients, which the first pass may lack
            self.drop("recompute")
            if row >= 0 and self._grads and torch.is_grad_enabled():
                hook_grads(output, self._grad_hook(index, row), self._repeated)
            return
        if reason is not None:
            self.drop(reason)
        elif row >= 0:
            self._record(index, output, row, staged(frame, row))
        elif state.checking:
            self._check(index, output, staged(frame, -1))
        else:
            self.drop("sampling" if state.is_open else "outside_step")

    def commit(self, frame: Frame, completed: bool) -> None:
        """A root forward ended: keep what its hooks staged if it completed, else count it in `dropped`."""
        if not frame.items:
            return
        staged: Staged = frame.items[0]
        with self.lock:
            if not completed:
                self.drop("raised", staged.calls)
                return
            if staged.acts:
                # The step it began in, or the open one when that step's row was taken meanwhile (threads).
                row = staged.row if self.buffers.is_live(staged.row) else self.state.row
                if row < 0:
                    self.drop("outside_step", staged.calls)
                    return
                for item in staged.acts:
                    self.buffers.acts.commit(item, row)
                self.call_log.keep(row, staged.evidence)
            self.checks.extend(staged.checks)

    def _rank(self, direction: int, index: int) -> None:
        ranked = self._ranked[direction]
        if not ranked[index]:
            ranked[index] = True
            (self.backward_order if direction else self.forward_order).append(index)

    def _record(self, index: int, output: Any, row: int, staged: Staged | None) -> None:
        self.observed[index] = True
        if not self._ranked[0][index]:
            self._rank(0, index)
        if staged is not None:
            staged.calls += 1
        x = (output if type(output) is torch.Tensor else first_float(output)) if self._capture else None
        if x is not None and not x.is_floating_point():  # a bare integer tensor: nothing to describe
            x = None
        if x is not None and not is_plain(x):
            self.drop("unsupported_layout")
            x = None
        if x is not None:  # an empty output too: called, with a count of 0 (the table reads it detached)
            buffers = self.buffers
            if buffers.device is None:
                buffers.allocate(x.device)
            item = buffers.acts.stage(row, index, x)
            if item is not None:
                ordinal = self.call_log.call(row, index)  # which call of the module: the evidence of shared ones
                if staged is None:
                    buffers.acts.commit(item)
                    if ordinal is not None:
                        self.call_log.keep(row, [(index, ordinal, RecordTable.holds_nonfinite(item))])
                else:
                    staged.acts.append(item)
                    if ordinal is not None:
                        staged.evidence.append((index, ordinal, RecordTable.holds_nonfinite(item)))
        if self._grads and torch.is_grad_enabled():
            hook_grads(output, self._grad_hook(index, row), self._repeated)

    def _repeated(self) -> None:
        """A backward went through an output a second time (`retain_graph=True`): keep the first, label the step."""
        with self.lock:
            self.drop("retain_graph")
            self.label("retain_graph")

    def _traced_forward(self, index: int, output: Any) -> None:
        # Traced by torch.compile: read one flag, append to one list, register gradient hooks; nothing else.
        self.is_traced = True  # set while tracing (a constant of the trace, not in the graph)
        x = first_float(output)
        if x is None:
            return
        if self.state.recording:
            if self._capture:
                self.traced.append((0, index, x.detach().to(torch.float32, copy=True)))
            if self._grads and torch.is_grad_enabled():
                hook_grads(output, self._traced_grad_hooks[index])
        elif self.state.checking_now:
            self.traced.append((-1, index, torch.stack(torch.aminmax(x.detach()))))
            if torch.is_grad_enabled():
                hook_grads(output, self._traced_check_hooks[index])

    # ---- gradients -----------------------------------------------------------------------------------------
    def _grad_hook(self, index: int, row: int) -> GradHook:
        return partial(self._grad_hooks[index], row)

    def _make_grad_hook(self, index: int) -> CalledHook:
        """Module `index`'s output-gradient hook, `hook(row, grad)`: made once, bound to a step's row per call."""

        def hook(row: int, grad: torch.Tensor | None) -> None:
            if grad is not None:
                start = time.perf_counter()
                with self.lock:
                    self._on_grad(index, row, grad)
                self.budget.add_own(time.perf_counter() - start)

        return CalledHook(hook, self.errors, self.grad_where[index])

    def _on_grad(self, index: int, row: int, raw: torch.Tensor) -> None:
        grad = plain_grad(raw)
        if grad is None:
            self.drop("unsupported_layout")
            return
        if not self._ranked[1][index] and self.buffers.is_live(row):
            self._rank(1, index)
        self.observe_grad(row, index, grad.detach() if grad.requires_grad else grad)

    def _traced_grad_hook(self, index: int) -> GradHook:
        def hook(grad: torch.Tensor) -> None:
            # Traced into the backward graph: only in-place updates of a device tensor are allowed here.
            if self.stage is not None:
                self.stage[index, :3].copy_(combine_norms(self.stage[index, :3], norm_of(grad)[:3]))

        return hook

    # ---- the end of a step ---------------------------------------------------------------------------------
    def settle(self) -> None:
        """Close the recorded step: what traced hooks handed over joins its row; the rows wait (`_step.py`)."""
        row = self.state.row
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
        self.buffers.close_step()

    def _take_stage(self, row: int) -> None:
        """Add the output-gradient sums of squares that compiled backwards accumulated to `row` (then zero them)."""
        stage = self.stage
        if stage is None or not self.buffers.is_live(row):
            return
        sums = stage[:, :3].double()
        norms = torch.cat((sums, torch.zeros_like(sums[:, :1])), dim=1)  # norm records (engine's `norm_of`)
        slot = self.buffers.ready(row, stage.device)
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

    # ---- rows -----------------------------------------------------------------------------------------------
    def observe_activation(self, row: int, index: int, x: torch.Tensor, *, owned: bool = False) -> None:
        """Add output `x` (detached) of module `index` to row `row`."""
        self.buffers.acts.add(self.buffers.ready(row, x.device), index, x, owned=owned)

    def observe_grad(self, row: int, index: int, grad: torch.Tensor) -> None:
        """Add the gradient of module `index`'s output to row `row`; counted `late_gradient` once it is taken.

        A gradient autograd hands to a hook is kept as it is, not copied: autograd never writes into it afterwards
        (and while the table holds it, `AccumulateGrad` cannot adopt it as a `.grad` to accumulate into); a view
        is copied, so that it does not keep a larger buffer alive."""
        buffers = self.buffers
        if not buffers.is_live(row):
            self.drop("late_gradient")
            return
        if buffers.device is None:
            buffers.allocate(grad.device)
        buffers.grads.add(row, index, grad, owned=not is_view(grad))

    def set_grad_factor(self, factor: torch.Tensor | None) -> None:
        """`1 / loss scale` of the open step's backward (GradScaler): its output-gradient norms are divided by it."""
        row = self.state.row
        if row >= 0 and factor is not None:
            self.buffers.grad_factors[row % self.buffers.rows] = factor

    def add_loss(self, value: torch.Tensor) -> None:
        """Add the 0-d float64 loss `value` to the open row's loss (averaged over the calls of the step); count it
        dropped when the step is not measured (its loss is in the stepper's `LossLog` either way)."""
        row = self.state.row
        if row < 0:
            self.drop("sampling_loss")
            return
        slot = self.buffers.slot(row, value.device)
        losses = self.buffers.losses
        if losses is not None:
            losses[slot : slot + 1].add_(value.reshape(1).to(losses))
        self.buffers.loss_calls[slot] += 1

    # ---- unrecorded steps: only whether outputs and their gradients are finite -------------------------------
    def _check(self, index: int, output: Any, staged: Staged | None) -> None:
        self.drop("sampling")
        self.observed[index] = True
        self._rank(0, index)
        x = first_float(output)
        if x is None or not x.numel() or not is_plain(x):
            return
        log = self.call_log  # with shared modules, where in a forward each call takes place (else: forward_order)
        ordinal = log.call(checked(self.state.step), index)
        place = log.place(index, ordinal) if log.shared else None
        (self.checks if staged is None else staged.checks).append((0, index, torch.aminmax(x.detach()), place))
        if torch.is_grad_enabled():
            hook_grads(output, self._check_hook(index), self._repeated)

    def _check_hook(self, index: int) -> GradHook:
        def hook(grad: torch.Tensor) -> None:
            plain = plain_grad(grad)
            if plain is not None and plain.numel():
                with self.lock:
                    self._rank(1, index)
                    self.checks.append((1, index, torch.aminmax(plain), None))

        return CalledHook(hook, self.errors, self.grad_where[index])

    def _traced_check_hook(self, index: int) -> GradHook:
        def hook(grad: torch.Tensor) -> None:
            if self.stage is not None:
                hit = ~torch.isfinite(torch.stack(torch.aminmax(grad))).all()
                self.stage[index, 3].add_(hit.to(self.stage.dtype))

        return hook

    def fold_flags(self, step: int) -> None:
        """Fold the checked step's non-finite findings into the first non-finite steps, on the device."""
        found: list[tuple[int, int, tuple[torch.Tensor, ...], int | None]] = [
            (d, j, tuple(pair), place) for d, j, pair, place in self.checks
        ]
        self.checks = []
        traced = [(0, j, tuple(t.unbind()), None) for kind, j, t in self._take_traced() if kind == -1]
        for _, j, _, _ in traced:
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
        bad = ~torch.isfinite(torch.stack([v for _, _, pair, _ in found for v in pair]).view(-1, 2)).all(1)
        cells = self.positions([d * len(self.paths) + j for d, j, _, _ in found], device)
        hits.index_add_(0, cells, bad.float())
        if stage is not None:
            hits[len(self.paths) :].add_(stage[:, 3].to(device))
            stage[:, 3].zero_()
        self._ensure_flags(device)
        if self.first is None or self.first_place is None:
            return
        newly = (hits.view(2, -1) > 0) & (self.first < 0)
        self.first.copy_(torch.where(newly, step, self.first))
        if any(place is not None for _, _, _, place in found):  # shared modules: where in a forward each module's
            # first non-finite call took place (forward; UNPLACED: unknown)
            places = self.positions([UNPLACED if p is None or d else p for d, _, _, p in found], device)
            placed = torch.full((2 * len(self.paths),), UNPLACED, dtype=torch.int64, device=device)
            placed.scatter_reduce_(0, cells, torch.where(bad, places, UNPLACED), "amin")
            self.first_place.copy_(torch.where(newly[0], placed[: len(self.paths)], self.first_place))

    def _ensure_flags(self, device: torch.device) -> None:
        if self.flags is None or self.first is None:
            self.flags = torch.ones(2, len(self.paths), dtype=torch.bool, device=device)
            self.first = torch.full((2, len(self.paths)), -1, dtype=torch.int64, device=device)
        if self.first_place is None:
            self.first_place = torch.full((len(self.paths),), UNPLACED, dtype=torch.int64, device=self.first.device)

    # ---- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What this recorder keeps across steps: dropped counts, which modules ran and in what order, the units'
        activity and the first non-finite steps of unrecorded steps (device values copied to the CPU)."""
        state: dict[str, Any] = {"dropped": dict(self.dropped), "observed": list(self.observed)}
        state.update(forward_order=list(self.forward_order), backward_order=list(self.backward_order))
        state.update(paths=list(self.paths), param_names=list(self.param_names))
        state["param_shapes"] = [list(shape) for shape in self.param_shapes]
        self.buffers.acts.flush()
        state["units"] = self.buffers.acts.units.state()
        state["first"] = None if self.first is None else self.first.cpu().clone()
        state["residual_paths"] = list(self.residual.paths)
        state.update(self.attention.state_dict())
        return state

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (checked by the caller: nothing here refuses it)."""
        self.dropped = dict(saved["dropped"])
        self.observed = list(saved["observed"])
        self.forward_order, self.backward_order = list(saved["forward_order"]), list(saved["backward_order"])
        count = len(self.paths)
        self._ranked = (
            [j in self.forward_order for j in range(count)],
            [j in self.backward_order for j in range(count)],
        )
        device = self.buffers.device or self.params.device()
        self.attention.load_state_dict(saved)
        self.buffers.acts.load_units(saved["units"], device)
        if saved["first"] is not None:
            self.first = saved["first"].to(device)
            self.flags = torch.ones_like(self.first, dtype=torch.bool)
            self.first_place = None  # not saved: the loaded steps are placed by `forward_order`

    def modules(self) -> list[nn.Module | None]:
        """The watched modules (`None` for those deleted)."""
        return [ref() for ref in self.module_refs]


def _normal_tensors() -> contextlib.AbstractContextManager[None]:
    """Under `torch.inference_mode()` (eval forwards recorded), leave it while recording: what the tables allocate
    and copy must be normal tensors, updated in place later."""
    return torch.inference_mode(False) if torch.is_inference_mode_enabled() else contextlib.nullcontext()


def _device_of(module: nn.Module) -> torch.device:
    for parameter in module.parameters():
        return parameter.device
    for buffer in module.buffers():
        return buffer.device
    return torch.device("cpu")


_TAGS = ("watch",)
