"""`Watch`: the callback that monitors a model while it trains, with its own plain-loop driver (`watch()` makes one)."""

from __future__ import annotations

import threading
import weakref
from dataclasses import replace
from typing import Any

import torch
import torch.nn as nn

from .._check import checked
from ..callbacks import LoopDriver
from ..callbacks._base import Callback
from ..callbacks._steps import ForwardFrames
from ..distributed import grad_reduction
from ..hooks import HookHandle, normalize_path
from ..hooks._calls import HookErrors, contained
from ..hooks._guards import check_hookable, check_real_device
from ..hooks._select import choose_modules
from ..results._nonfinite import first_from_flags, merge_first
from ..results._results import WatchResults
from ._assemble import build_results
from ._extras import collect_extras, watch_meta
from ._options import WatchInit, WatchOptions, method_options_signature
from ._recorder import Recorder
from ._residual import repeated_blocks
from ._scaler import GradScalerSteps, check_scaler
from ._selection import ACTIVATION_TYPES, default_selection, default_selector
from ._state import check_fits, check_state, state_of, stepper_state
from ._stepper import Stepper

__all__ = ["ACTIVATION_TYPES", "Watch", "default_selector"]


class Watch(Callback):
    """Monitor a model while it trains; see `watch()` for the arguments. A `Callback`, and a context manager.

    Its parts: a `Recorder` (the hooks and the device rows they fill), a `Stepper` (the step rule: it owns the
    `StepState` the hooks read, the host store of kept steps and the sinks), and the options.
    """

    @checked()
    @method_options_signature(WatchInit)
    def __init__(
        self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, **options: Any
    ) -> None:
        chosen = WatchOptions(**options)
        self.options = replace(chosen, scaler=None)  # the scaler is held by weakref only (GradScalerSteps)
        self.errors = HookErrors("watch()", self.options.strict, self._count_error)
        if model is not None:
            check_hookable(model, "model")
            if self.options.select is not None:
                choose_modules(model, self.options.select, "select")  # fail now, not with an empty run
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
        self.select = self.options.select
        self.sinks = list(self.options.sinks)
        self._lock = threading.RLock()  # hooks and events from several threads run one at a time
        self.stepper = Stepper(self.options, self.sinks, self._lock, self.results)
        scaler = chosen.scaler
        self.stepper.scaler = None if scaler is None else GradScalerSteps(check_scaler(scaler))
        self._model_ref = None if model is None else weakref.ref(model)  # what attach() watches by default
        self._optimizer_ref = None if optimizer is None else weakref.ref(optimizer)
        self._recorder: Recorder | None = None
        self._attached = False
        self._driver: LoopDriver | None = None
        self._meta: dict[str, Any] = {}
        self._pending_state: dict[str, Any] | None = None  # a loaded state waiting for the modules
        self._frame_handles: list[HookHandle] = []

    # ---- attaching -------------------------------------------------------------------------------------------
    def attach(self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None) -> LoopDriver:
        """Start watching `model` (default: the one given at construction) in a plain loop; return the driver.

        Raises:
            RuntimeError: this watch is already attached (detach it first).
            ValueError: no model was given, here or at construction.
        """
        if self._attached:
            raise RuntimeError("watch is already attached to a model; call detach() before attaching it again")
        model = model if model is not None else _alive(self._model_ref)
        if model is None:
            raise ValueError("model must be given to attach() or to watch(model, ...), got None")
        optimizer = optimizer if optimizer is not None else _alive(self._optimizer_ref)
        self._driver = LoopDriver([self], model, optimizer, train_only=self.options.train_only)
        self.stepper.dormancy = self._set_dormant
        self.stepper.skipper = self._driver  # it drives the watch alone: it may let a stretch's steps pass
        return self._driver

    def attach_optimizer(self, optimizer: torch.optim.Optimizer, *, after_step: bool = False) -> None:
        """Count steps by `optimizer`'s steps from now on, and record update ratios (attached, plain-loop driver).

        The open step goes on as the step of `optimizer`'s next step, or, with `after_step` (called when
        `optimizer` has just stepped), ends with the step that just ran. `hookscope run` uses it for a model
        whose optimizer is known only when it first steps.

        Raises:
            TypeError: `optimizer` is not an optimizer.
            RuntimeError: the watch is not attached by `attach()`, or already has an optimizer.
        """
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if self._driver is None or self.stepper.optimizer() is not None:
            raise RuntimeError("attach_optimizer needs a watch attached by attach() without an optimizer")
        with self._lock:
            self.stepper.set_optimizer(optimizer, after_step=after_step)
            self._meta["optimizer"] = type(optimizer).__name__
            self._driver.add_optimizer(optimizer)

    def _set_dormant(self, dormant: bool, batches: bool) -> bool:
        """Between two optimizer steps of the watch's own loop: leave the model alone until the next optimizer
        step (`True`: every hook of the watch paused but the optimizer's step post-hook, which decides the next
        step, and, with `batches`, the loop driver's forward pre-hook, which opens the steps), or follow it again
        (`False`); return whether the model is left alone now. A model traced by `torch.compile` keeps its hooks."""
        driver, recorder = self._driver, self._recorder
        if driver is None or recorder is None or self.stepper.optimizer() is None:
            return False
        if dormant and recorder.is_traced:
            return False
        if dormant:
            driver.follow_inside_steps(False)
            driver.follow_batches(batches)
            recorder.set_awake(False, root=True)
            for handle in self._frame_handles:
                handle.pause()
        else:
            for handle in self._frame_handles:
                handle.resume()
            recorder.set_awake(True)
            driver.follow_batches(True)
            driver.follow_inside_steps(True)
        return dormant

    def detach(self) -> None:
        """Stop watching: close the open step, flush, remove every hook; calling it again does nothing."""
        if self._driver is not None:
            driver, self._driver = self._driver, None
            driver.detach()
        elif self._attached:
            self.on_fit_end()

    def remove(self) -> None:
        """Stop watching and remove every hook: the same as `detach()` (every attachment has `remove()`)."""
        self.detach()

    def __enter__(self) -> Watch:
        """Attach in a plain loop (a watch already attached by `attach()` stays as it is); leaving detaches."""
        if self._driver is None:
            self.attach()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, traceback: object) -> None:
        if self._driver is not None:
            driver, self._driver = self._driver, None
            driver.detach(exc)

    @property
    def is_attached(self) -> bool:
        """Whether the hooks are in place."""
        return self._attached

    # ---- events ----------------------------------------------------------------------------------------------
    def on_fit_start(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Select the modules of `model` and place the hooks (steps count optimizer steps when one is given)."""
        if self._attached:
            raise RuntimeError("watch is already attached to a model; call detach() before attaching it again")
        check_hookable(model, "model")
        check_real_device(model, "model")
        scaler = self.stepper.scaler
        if scaler is not None and optimizer is None:
            raise ValueError(
                "scaler needs the optimizer (a skipped step is an optimizer step that did not happen): pass "
                "watch(model, optimizer, scaler=scaler)"
            )
        if self.select is None:
            modules, owners = default_selection(model)
        else:
            modules = owners = choose_modules(model, self.select, "select")
        params = [
            (normalize_path(f"{path}.{name}" if path else name), p)
            for path, module in owners
            for name, p in module.named_parameters(recurse=False)
            if p.requires_grad
        ]
        found = repeated_blocks(model) if "residual" in self.options.groups else []
        blocks = [(normalize_path(path), block) for path, block in found]
        recorder = self._recorder
        if recorder is None or not recorder.matches(modules, params, blocks):
            recorder = Recorder(modules, params, self.options, self.stepper.state, self.stepper.budget, blocks)
        else:
            recorder.rebind(modules, params, blocks)
        self._check_pending_state(recorder)  # before anything changes: a state that does not fit is refused
        self._model_ref = weakref.ref(model)
        self._optimizer_ref = None if optimizer is None else weakref.ref(optimizer)
        self.stepper.bind(recorder, model, optimizer)  # another model: a new store (a loaded state stays)
        self._meta = watch_meta(model, optimizer, self.options, self.select)
        self._meta["grad_reduction"] = grad_reduction(model, optimizer)  # DDP / FSDP2 / local (distributed)
        if scaler is not None:
            self._meta["grad_scaler"] = "unscaled" if scaler.readable else "scaled (GradScaler unreadable)"
        self._recorder = recorder
        state, self._pending_state = self._pending_state, None
        if state is not None:
            self._apply_state(state)
        recorder.lock, recorder.errors, recorder.label = self._lock, self.errors, self.stepper.label
        ends = (recorder.commit, self.stepper.frame_ended)  # the recorder keeps what the forward staged, then the
        # stepper counts it
        frames = ForwardFrames(self.options.train_only, ends, self.stepper.frame_began)
        recorder.frames = frames
        recorder.register(model)
        self._frame_handles = frames.register(model, owner=self, tags=("watch",), errors=self.errors)
        self._attached = True

    def batch_count(self) -> Stepper:
        """The watch keeps the run's count of training batches (its stepper's `StepState`): drivers follow it."""
        return self.stepper

    @contained
    def on_batch_start(self, batch: int) -> None:
        """Open (or continue) the step this training batch belongs to."""
        if self._recorder is not None and self._attached:
            self.stepper.batch_started()

    @contained
    def on_batch_end(self, batch: int) -> None:
        """Stop recording forwards of compiled models until the next training batch."""
        self.stepper.batch_ended()

    @contained
    def after_backward(self) -> None:
        """Keep the loss scale of this backward (with `scaler`); take the parameter gradient statistics now
        without an optimizer, or after the first backward of a closure that the optimizer's step runs."""
        self.stepper.backward_ended()

    @contained
    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Open the step if it has not begun (a closure step), take the parameter gradient statistics and copy
        the weights (for update ratios)."""
        self.stepper.optimizer_step_starting(optimizer)

    @contained
    def after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Record update-to-weight ratios and count the step."""
        self.stepper.optimizer_step_ended(optimizer)

    def on_fit_end(self, error: BaseException | None = None) -> None:
        """Close the open step, flush, warn about unobserved modules, remove the hooks, close the sinks."""
        recorder = self._recorder
        if recorder is None or not self._attached:
            return
        try:
            with self._lock:
                self.stepper.finish(error)
        except Exception as err:
            self.errors.failed(err, "on_fit_end")
        finally:
            while self._frame_handles:
                self._frame_handles.pop().remove()
            recorder.remove()
            self._attached = False
            for sink in self.sinks:
                sink.close()

    @contained
    def log_loss(self, loss: torch.Tensor | float) -> None:
        """Record the loss of the current step on the device (averaged when logged several times in a step)."""
        self.stepper.log_loss(loss)

    def _count_error(self, reason: str) -> None:
        if self._recorder is not None:
            self._recorder.drop(reason)

    # ---- reading ---------------------------------------------------------------------------------------------
    def results(self) -> WatchResults:
        """Return everything collected so far as `WatchResults` (flushes the device buffers: one transfer).

        Called during training, it includes the step in progress once that step's optimizer step (or, without an
        optimizer, its backward) is done: the step is closed then, and a loss logged for it afterwards is dropped.
        """
        with self._lock:
            return self._results()

    def _results(self) -> WatchResults:
        recorder = self._recorder
        if recorder is None:
            return WatchResults(meta=dict(self._meta))
        stepper = self.stepper
        stepper.settle_stretch()
        if self._attached and stepper.is_step_done():
            stepper.end_step()
        stepper.flush()
        table = stepper.store.table()
        results = build_results(
            table, recorder.paths, recorder.kinds, recorder.param_names, self.options, recorder.residual.paths
        )
        extras = collect_extras(recorder, model=_alive(self._model_ref))
        results.unit_activity = extras.unit_activity
        results.identical_units = extras.identical_units
        results.unobserved = extras.unobserved
        results.execution_order = [recorder.paths[i] for i in recorder.forward_order]
        orders = (recorder.forward_order, recorder.backward_order)
        first, places = recorder.first, recorder.first_place
        flagged = {} if first is None else first_from_flags(first, recorder.paths, orders, places)
        results.first_nonfinite = merge_first(stepper.first, flagged)
        dropped = stepper.store.dropped
        results.dropped = {**recorder.dropped, **({"capacity": dropped} if dropped else {})}
        if recorder.buffers.acts.units.mismatch:  # outputs whose number of units changed: not counted per unit
            results.dropped["unit_shape"] = recorder.buffers.acts.units.mismatch
        results.meta = {**self._meta, "recorded_steps": stepper.state.recorded, "stride": stepper.store.stride}
        results.meta["measured"] = self.measured
        if stepper.state.labelled:
            labels: dict[str, list[int]] = {}
            for label, step in stepper.state.labelled:
                labels.setdefault(label, []).append(step)
            results.meta["step_labels"] = labels
        results.skipped_steps = list(stepper.state.skipped)
        logged = stepper.losses.table()
        if logged is not None:
            results.logged_steps, results.logged_losses = logged
        return results

    @property
    def measured(self) -> dict[str, Any]:
        """Which steps were measured and what that cost so far, as `results().meta["measured"]` gives them, read
        without flushing the device buffers (between two steps, it adds no cost of its own to what it reports):
        `steps` (the steps that began), `budget` or `every`, `cost` (hookscope's host time over the rest of the
        steps' time), `seconds`, `step_cost`, `after_warmup` (`hookscope.callbacks._budget.Budget.summary`) and
        `recorded` (the steps measured and kept)."""
        with self._lock:
            self.stepper.settle_stretch()  # the steps of a stretch that passed so far are counted
            return {**self.stepper.budget.summary(), "recorded": self.stepper.state.recorded}

    def to_dataframe(self) -> Any:
        """`results().to_dataframe()`: long-format rows (needs pandas)."""
        return self.results().to_dataframe()

    def save(self, path: Any) -> Any:
        """`results().save(path)`: write the results atomically (safetensors + JSON); return the path."""
        return self.results().save(path)

    def state_dict(self) -> dict[str, Any]:
        """Counters and kept steps, to resume a run (`load_state_dict`); flushes the device buffers."""
        with self._lock:
            stepper = self.stepper
            if self._recorder is not None:
                stepper.batch_ended()
                stepper.end_step()
            stepper.flush()
            return state_of(stepper.state_dict(), self._recorder)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters and kept steps from `state_dict` (call before training resumes); all or nothing.

        The state is checked in full first, and against the watched modules (now, or at the next attach when
        the watch has none yet).

        Raises:
            ValueError: `state` is not a watch state dict of this version, does not fit the format (the field is
                named) or was saved for other modules or widths; the watch is left as it was.
        """
        check_state(state, self.options.hist_bins)
        if self._recorder is None:
            self._pending_state = state
            return
        check_fits(state["recorder"], self._recorder)
        self._apply_state(state)

    def _check_pending_state(self, recorder: Recorder) -> None:
        """Check that the state waiting to be loaded fits `recorder`; drop it (and raise) when it does not."""
        state = self._pending_state
        if state is not None:
            try:
                check_fits(state["recorder"], recorder)
            except ValueError:
                self._pending_state = None
                raise

    def _apply_state(self, state: dict[str, Any]) -> None:
        """Restore a checked state that fits: the stepper's part, then the recorder's."""
        self.stepper.load_state_dict(stepper_state(state))
        if self._recorder is not None and state["recorder"] is not None:
            self._recorder.load_state_dict(state["recorder"])


def _alive(ref: weakref.ref[Any] | None) -> Any:
    return None if ref is None else ref()
