"""`Watch`: the callback that monitors a model while it trains, with its own plain-loop driver (`watch()` makes one)."""

from __future__ import annotations

import threading
import weakref
from dataclasses import replace
from typing import Any

import torch
import torch.nn as nn

from .._check import checked
from ..callbacks import Callback, LoopDriver
from ..callbacks._steps import ForwardFrames
from ..distributed import grad_reduction
from ..hooks import HookErrors, HookHandle, check_hookable, normalize_path
from ..hooks._calls import contained
from ..hooks._guards import check_real_device
from ..hooks._select import choose_modules
from ..results import WatchResults, first_from_flags, merge_first
from ._assemble import build_results
from ._extras import collect_extras, watch_meta
from ._options import WatchInit, WatchOptions, method_options_signature
from ._recorder import Recorder
from ._scaler import GradScalerSteps, check_scaler
from ._selection import ACTIVATION_TYPES, default_selection, default_selector
from ._state import apply_pending_state, check_pending_state, load_watch_state, watch_state
from ._stepping import WatchSteps
from ._store import SeriesStore

__all__ = ["ACTIVATION_TYPES", "Watch", "default_selector"]


class Watch(WatchSteps, Callback):
    """Monitor a model while it trains; see `watch()` for the arguments. A `Callback`, and a context manager."""

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
        scaler = chosen.scaler
        self._scaler = None if scaler is None else GradScalerSteps(check_scaler(scaler))
        self._skipped: list[int] = []  # steps the scaler skipped (non-finite gradients)
        self._model_ref = None if model is None else weakref.ref(model)
        self._optimizer_ref = None if optimizer is None else weakref.ref(optimizer)
        self._recorder: Recorder | None = None
        self._attached = False
        self._driver: LoopDriver | None = None
        self._store = SeriesStore(self.options.capacity, self.options.every)
        self._batches = 0
        self._optimizer_steps = 0
        self._step = -1  # the open step (-1: none yet)
        self._recorded = 0
        self._first: dict[str, Any] = {"forward": None, "backward": None}
        self._warned_unobserved = False
        self._doctor: Any = None
        self._doctor_at = 0
        self._meta: dict[str, Any] = {}
        self._pending_state: dict[str, Any] | None = None  # a loaded state waiting for the modules
        self._lock = threading.RLock()  # hooks and events from several threads run one at a time
        self._frame_handles: list[HookHandle] = []
        self._in_step = False  # between the watched optimizer's step pre- and post-hook (a closure runs there)
        self._closure_grads = False  # parameter gradients were taken from a backward inside the step
        self._step_backwards = 0  # backwards in the open step
        self._labelled: list[list[Any]] = []  # [label, step]: steps labelled rather than merged (JSON-able)

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
        if self._driver is None or self._optimizer_ref is not None:
            raise RuntimeError("attach_optimizer needs a watch attached by attach() without an optimizer")
        with self._lock:
            self._optimizer_ref = weakref.ref(optimizer)
            self._optimizer_steps = max(self._step, 0) + (1 if after_step and self._step >= 0 else 0)
            self._meta["optimizer"] = type(optimizer).__name__
            self._driver.add_optimizer(optimizer)

    def detach(self) -> None:
        """Stop watching: close the open step, flush, remove every hook; calling it again does nothing."""
        if self._driver is not None:
            driver, self._driver = self._driver, None
            driver.detach()
        elif self._attached:
            self.on_fit_end()

    def __enter__(self) -> Watch:
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
        if self._scaler is not None and optimizer is None:
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
        recorder = self._recorder
        if recorder is None or not recorder.matches(modules, params):
            if recorder is not None:  # another model: start afresh (a loaded state stays for the first one)
                self._store = SeriesStore(self.options.capacity, self.options.every)
            recorder = Recorder(modules, params, self.options)
        else:
            recorder.rebind(modules, params)
        check_pending_state(self, recorder)  # before anything changes: a state that does not fit is refused
        self._model_ref = weakref.ref(model)
        self._optimizer_ref = None if optimizer is None else weakref.ref(optimizer)
        self._meta = watch_meta(model, optimizer, self.options, self.select)
        self._meta["grad_reduction"] = grad_reduction(model, optimizer)  # DDP / FSDP2 / local (distributed)
        if self._scaler is not None:
            self._meta["grad_scaler"] = "unscaled" if self._scaler.readable else "scaled (GradScaler unreadable)"
        self._recorder = recorder
        apply_pending_state(self)
        recorder.lock, recorder.errors, recorder.label = self._lock, self.errors, self._label
        recorder.frames = frames = ForwardFrames(self.options.train_only, self._frame_ended, self._frame_began)
        recorder.register()
        self._frame_handles = frames.register(model, owner=self, tags=("watch",), errors=self.errors)
        self._attached = True

    @contained
    def on_batch_start(self, batch: int) -> None:
        """Open (or continue) the step this training batch belongs to."""
        recorder = self._recorder
        if recorder is None or not self._attached:
            return
        self._batches += 1
        self._poll_scaler()
        self._ensure_step()
        recorder.enter_batch(recorder.open_row)

    @contained
    def on_batch_end(self, batch: int) -> None:
        """Stop recording forwards of compiled models until the next training batch."""
        if self._recorder is not None:
            self._recorder.leave_batch()

    @contained
    def after_backward(self) -> None:
        """Keep the loss scale of this backward (with `scaler`); take the parameter gradient statistics now
        without an optimizer, or after the first backward of a closure that the optimizer's step runs."""
        recorder = self._recorder
        if recorder is None:
            return
        self._step_backwards += 1
        if self._scaler is not None:
            recorder.set_grad_factor(self._scaler.factor())
        if self._optimizer_ref is None:
            recorder.record_param_grads()
        elif self._in_step and not self._closure_grads:  # the gradients the closure step starts from
            self._closure_grads = True
            recorder.record_param_grads()

    @contained
    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Open the step if it has not begun (a closure step), take the parameter gradient statistics and copy
        the weights (for update ratios)."""
        if self._recorder is not None and self._is_ours(optimizer):
            if self._optimizer_ref is not None:
                self._ensure_step()
            self._in_step, self._closure_grads = True, False
            self._recorder.record_param_grads()
            self._recorder.snapshot()

    @contained
    def after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Record update-to-weight ratios and count the step."""
        if self._recorder is not None and self._is_ours(optimizer):
            self._in_step = False
            self._recorder.record_ratios()
            self._optimizer_steps += 1
            if self._scaler is not None:
                self._scaler.stepped = True

    def on_fit_end(self, error: BaseException | None = None) -> None:
        """Close the open step, flush, warn about unobserved modules, remove the hooks, close the sinks."""
        recorder = self._recorder
        if recorder is None or not self._attached:
            return
        try:
            with self._lock:
                self._finish(error)
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
        if self._recorder is not None:
            self._recorder.log_loss(loss)

    def _is_ours(self, optimizer: torch.optim.Optimizer) -> bool:
        return self._optimizer_ref is None or self._optimizer_ref() is optimizer

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
        if self._attached and self._is_step_done():
            self._end_step()
        self._flush()
        table = self._store.table()
        results = build_results(table, recorder.paths, recorder.kinds, recorder.param_names, self.options)
        extras = collect_extras(recorder, model=_alive(self._model_ref))
        results.unit_activity = extras.unit_activity
        results.identical_units = extras.identical_units
        results.unobserved = extras.unobserved
        results.execution_order = [recorder.paths[i] for i in recorder.forward_order]
        orders = (recorder.forward_order, recorder.backward_order)
        flagged = {} if recorder.first is None else first_from_flags(recorder.first, recorder.paths, orders)
        results.first_nonfinite = merge_first(self._first, flagged)
        results.dropped = {**recorder.dropped, **({"capacity": self._store.dropped} if self._store.dropped else {})}
        if recorder.buffers.acts.units.mismatch:  # outputs whose number of units changed: not counted per unit
            results.dropped["unit_shape"] = recorder.buffers.acts.units.mismatch
        results.meta = {**self._meta, "recorded_steps": self._recorded, "stride": self._store.stride}
        if self._labelled:
            labels: dict[str, list[int]] = {}
            for label, step in self._labelled:
                labels.setdefault(label, []).append(step)
            results.meta["step_labels"] = labels
        results.skipped_steps = list(self._skipped)
        return results

    def to_dataframe(self) -> Any:
        """`results().to_dataframe()`: long-format rows (needs pandas)."""
        return self.results().to_dataframe()

    def save(self, path: Any) -> Any:
        """`results().save(path)`: write the results atomically (safetensors + JSON); return the path."""
        return self.results().save(path)

    def state_dict(self) -> dict[str, Any]:
        """Counters and kept steps, to resume a run (`load_state_dict`); flushes the device buffers."""
        return watch_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters and kept steps from `state_dict` (call before training resumes); all or nothing.

        The state is checked in full first, and against the watched modules (now, or at the next attach when
        the watch has none yet).

        Raises:
            ValueError: `state` is not a watch state dict of this version, does not fit the format (the field is
                named) or was saved for other modules or widths; the watch is left as it was.
        """
        load_watch_state(self, state)


def _alive(ref: weakref.ref[Any] | None) -> Any:
    return None if ref is None else ref()
