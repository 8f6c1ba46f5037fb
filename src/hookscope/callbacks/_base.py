"""The training-loop event protocol (`Callback`) and the driver that emits its events in a plain loop."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any, Protocol

import torch
import torch.nn as nn

from .._check import NON_EMPTY, checked, hint_for
from .._torch import queue_after_backward
from ..hooks import HookHandle, register_module_hook, register_optimizer_hook
from ..hooks._calls import Eager
from ..hooks._guards import check_hookable
from ..hooks._tree import tensor_leaves
from ._steps import uncounted

__all__ = ["BatchCount", "BatchNumbers", "Callback", "LoopDriver"]


class Callback:
    """No-op base of the events a training loop emits; override the ones you need.

    The order within one training batch is `on_batch_start`, (forward), `after_backward`,
    `before_optimizer_step`, `after_optimizer_step`, `on_batch_end`; `on_fit_start` and `on_fit_end` bracket the
    whole run. Drive the events from a plain loop with `attach`, from Lightning with
    `hookscope.integrations.lightning.HookscopeLightningCallback`, from a Hugging Face `Trainer` with
    `hookscope.integrations.transformers.HookscopeTrainerCallback`.
    """

    def on_fit_start(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Start observing `model` (register hooks here); `optimizer` is the one that trains it, if known."""

    def on_fit_end(self, error: BaseException | None = None) -> None:
        """Stop observing (remove hooks, flush); `error` is the exception that ended the run, if any."""

    def on_batch_start(self, batch: int) -> None:
        """Begin training batch number `batch` (counted from 0 over the run, once: see `BatchNumbers`)."""

    def on_batch_end(self, batch: int) -> None:
        """End training batch number `batch`; its forward, backward and optimizer step are done."""

    def after_backward(self) -> None:
        """React to a finished backward pass (gradients are accumulated in `.grad`)."""

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """React to `optimizer` being about to update the parameters (gradients final)."""

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """React to `optimizer` having updated the parameters."""

    def batch_count(self) -> BatchCount | None:
        """The run's count of training batches, when this callback keeps it (`watch()`: its step state); `None`
        (the default) otherwise. A driver numbers its batches by the first of its callbacks that keeps one."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Return the state needed to resume (counters, collected data); empty by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state returned by `state_dict`."""

    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> LoopDriver:
        """Drive this callback's events from a plain training loop over `model`: see `LoopDriver`.

        Example:
            >>> import torch, torch.nn as nn
            >>> from hookscope import Callback
            >>> class Count(Callback):
            ...     batches = 0
            ...     def on_batch_start(self, batch): self.batches += 1
            >>> model, counter = nn.Linear(2, 1), Count()
            >>> with counter.attach(model):
            ...     for _ in range(3):
            ...         model(torch.ones(4, 2)).sum().backward()
            >>> counter.batches
            3
        """
        return LoopDriver([self], model, optimizer)


hint_for(Callback, "hookscope Callback objects: ActivationStats, HookCallback, Watch or a subclass of Callback")


class BatchCount(Protocol):
    """The run's count of training batches begun, as a callback keeps it (`watch()`'s stepper)."""

    @property
    def batches(self) -> int: ...


class BatchNumbers:
    """The number of each training batch a driver emits (`LoopDriver`, the trainer integrations' relay).

    A run counts its batches once: where one of the driver's callbacks keeps the count (`Callback.batch_count`:
    `watch()`'s step state, written by its stepper alone), the driver follows it, so every callback sees the
    number the watch gives the batch (a forward that raised is no batch; the batches of steps the watch leaves
    alone are counted); otherwise the driver counts them itself.

    Args:
        callbacks: The driver's callbacks.
    """

    def __init__(self, callbacks: Iterable[Callback]) -> None:
        self.opened = -1  # the number `begin` gave last (its batch's `on_batch_end` carries it too)
        self._kept = next((count for count in (c.batch_count() for c in callbacks) if count is not None), None)

    @property
    def current(self) -> int:
        """The number of the open (or last) training batch (-1: none yet), counting those the driver did not
        see (a watch leaving steps alone counts one batch a step)."""
        return self.opened if self._kept is None else self._kept.batches - 1

    def begin(self) -> int:
        """Number the batch that begins now (the keeper counts it when told, in `on_batch_start`)."""
        self.opened = self.opened + 1 if self._kept is None else self._kept.batches
        return self.opened

    def restore(self, current: int) -> None:
        """Go on from batch `current` (a saved run); a kept count is restored by its keeper."""
        self.opened = current


class LoopDriver:
    """Emit `Callback` events from a plain training loop, through hooks on the root model and the optimizer.

    Each forward of `model` that belongs to a training step (see `hookscope.callbacks._steps`: in training mode,
    with gradients, not a recomputation) begins a training batch (`on_batch_start`); the batch ends when the next
    one begins, when `model` runs a forward in eval mode, or at `detach`. Forwards under `torch.no_grad()` or
    `torch.inference_mode()` neither begin nor end a batch. `after_backward` fires when a backward through the
    root output completes; `before/after_optimizer_step` fire around `optimizer.step()` when an optimizer is given
    (the forwards and backwards of a closure run between them). `on_fit_start` runs now; `detach()` (or leaving the
    `with` block) runs `on_fit_end`, also when the block raises, and removes the driver's hooks. The hooks hold
    the driver, not the model; a pickled or deep-copied model carries none of them. The batches are numbered by
    the run's one count (`BatchNumbers`): a watch's, when one is among `callbacks`, else the driver's.

    Args:
        callbacks: The callbacks to drive, in event order.
        model: The root model.
        optimizer: The optimizer that trains it, if any.
        train_only: Whether only training forwards are batches (`False`: every forward is one).

    Raises:
        TypeError: `model` is not an `nn.Module`, or a callback is not a `Callback`.
    """

    @checked(callbacks=NON_EMPTY)
    def __init__(
        self,
        callbacks: Iterable[Callback],
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        train_only: bool = True,
    ) -> None:
        check_hookable(model, "model")
        self._model = weakref.ref(model)
        self.callbacks = list(callbacks)
        for callback in self.callbacks:
            if not isinstance(callback, Callback):
                raise TypeError(f"callbacks must be hookscope Callback objects, got {type(callback).__name__}")
        self._numbers = BatchNumbers(self.callbacks)
        self.is_batch_open = False
        self.train_only = train_only
        self._handles: list[HookHandle] = []
        self._inside_steps: list[HookHandle] = []  # the hooks of `after_backward` and `before_optimizer_step`
        # (paused while the events inside a step are not followed)
        self.steps_to_skip = 0  # optimizer steps still to let pass without an event (`skip_steps`)
        self.batches_to_skip = 0  # training batches still to let pass without an event (`skip_batches`)
        self.marked: float | None = None  # when the count of a stretch let pass reached its mark (`perf_counter`)
        self._mark = -1  # the count of batches or steps still to skip at which to mark the time
        self._started: list[Callback] = []
        self._detached = False
        self._lock = threading.RLock()  # forwards from several threads begin and end batches one at a time
        self._wants_backward = any(_overrides(c, "after_backward") for c in self.callbacks)
        try:
            self._register(model, optimizer)
            for callback in self.callbacks:
                callback.on_fit_start(model, optimizer)
                self._started.append(callback)
        except BaseException as err:
            self.detach(err)
            raise

    def _register(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        tags = ("LoopDriver",)
        add = self._handles.append
        self._batch_hook = register_module_hook(
            model, "forward_pre", Eager(self._forward_pre), owner=self, tags=tags, prepend=True
        )
        add(self._batch_hook)
        if self._wants_backward:
            backward_hook = register_module_hook(model, "forward", Eager(self._forward), owner=self, tags=tags)
            add(backward_hook)
            self._inside_steps.append(backward_hook)
        if optimizer is not None:
            self.add_optimizer(optimizer)

    @property
    def batch(self) -> int:
        """The number of the open (or last) training batch, from 0 over the run (-1: none yet); see
        `BatchNumbers`."""
        return self._numbers.current

    def follow_inside_steps(self, follow: bool) -> None:
        """Stop (`False`) or resume (`True`) emitting the events inside a step, `after_backward` and
        `before_optimizer_step`: their hooks (on the model's forward, on the optimizer's step) are paused meanwhile,
        so a training step costs the driver its root forward pre-hook and the optimizer's step post-hook. A callback
        that measures only some steps (`watch()` under its budget) uses it for the steps it leaves alone; call it
        outside a forward of the model (an optimizer's step post-hook is a place)."""
        for handle in self._inside_steps:
            if follow:
                handle.resume()
            else:
                handle.pause()

    def follow_batches(self, follow: bool) -> None:
        """Stop (`False`) or resume (`True`) beginning and ending training batches: the forward pre-hook on the
        model is paused meanwhile. A callback that leaves some steps alone and knows where they begin (`watch()`,
        at the optimizer's step) uses it; the batch open when it stops ends at the next forward once resumed."""
        if follow:
            self._batch_hook.resume()
        else:
            self._batch_hook.pause()

    def skip_batches(self, count: int, mark: int = -1) -> None:
        """Let the next `count` training batches begin and end without an event: the forward pre-hook numbers them
        and nothing else (forwards that are no batch are told apart as always). A callback that leaves a stretch of
        batches alone (`ActivationStats` under its budget) asks for it; it is the one callback of its driver. With
        `mark` (0 to `count - 1`), `marked` is when the batch that leaves `mark` of them to skip began: the
        callback times the stretch's later part apart (`Budget.stretch_ended`)."""
        self.batches_to_skip, self._mark, self.marked = count, mark, None

    def skip_steps(self, count: int, mark: int = -1) -> None:
        """Let the next `count` optimizer steps pass without an event: the step post-hook counts them down
        (`steps_to_skip`), and the step after them is emitted as usual. A callback that leaves a stretch of steps
        alone (`watch()` under its budget, with the batches and the events inside steps already unfollowed)
        counts them from `steps_to_skip` when it needs to; it is the one callback of its driver. With `mark` (0 to
        `count - 1`), `marked` is when the step that leaves `mark` of them to skip ended, as `skip_batches`."""
        self.steps_to_skip, self._mark, self.marked = count, mark, None

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Emit `before/after_optimizer_step` around the steps of `optimizer` from now on."""
        tags = ("LoopDriver",)
        step_pre = register_optimizer_hook(optimizer, "step_pre", self._step_pre, owner=self, tags=tags)
        self._handles.append(step_pre)
        self._inside_steps.append(step_pre)
        self._handles.append(register_optimizer_hook(optimizer, "step_post", self._step_post, owner=self, tags=tags))

    def _forward_pre(self, module: nn.Module, args: Any) -> None:
        if module is not self._model():
            return
        reason = uncounted(module, self.train_only)
        if reason is not None and reason != "eval":  # no_grad, inference_mode, recompute: not a batch at all
            return
        with self._lock:
            self.end_batch()
            if reason is None and self.batches_to_skip:  # a batch let pass: numbered, no event
                self.batches_to_skip -= 1
                if self.batches_to_skip == self._mark:
                    self.marked = time.perf_counter()
                self._numbers.begin()
            elif reason is None:
                batch = self._numbers.begin()
                self.is_batch_open = True
                for callback in self.callbacks:
                    callback.on_batch_start(batch)

    def _forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self.is_batch_open or module is not self._model() or uncounted(module, self.train_only):
            return
        if type(output) is torch.Tensor:  # one output: a tensor hook fires once per backward through it (cheaper)
            if output.requires_grad:
                output.register_hook(self._backward_started)  # type: ignore[no-untyped-call]
            return
        leaves = [t for _, t in tensor_leaves(output) if t.requires_grad]
        if leaves:  # fires once per backward through the output, then waits for the whole backward to finish
            torch.autograd.graph.register_multi_grad_hook(leaves, self._backward_started, mode="any")

    def _backward_started(self, grad: Any) -> None:
        queue_after_backward(self._after_backward)

    def _after_backward(self) -> None:
        for callback in self.callbacks:
            callback.after_backward()

    def _step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for callback in self.callbacks:
            callback.before_optimizer_step(optimizer)

    def _step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.steps_to_skip:
            self.steps_to_skip -= 1
            if self.steps_to_skip == self._mark:
                self.marked = time.perf_counter()
            return
        for callback in self.callbacks:
            callback.after_optimizer_step(optimizer)

    def end_batch(self) -> None:
        """End the open training batch, if any (`on_batch_end`)."""
        if self.is_batch_open:
            self.is_batch_open = False
            for callback in self.callbacks:
                callback.on_batch_end(self._numbers.opened)

    def detach(self, error: BaseException | None = None) -> None:
        """End the open batch, run `on_fit_end` and remove the driver's hooks; calling it again does nothing.

        Every started callback gets `on_fit_end` and the hooks are removed even when one of them raises; the
        first such exception is re-raised afterwards.
        """
        if self._detached:
            return
        self._detached = True
        failure: BaseException | None = None
        try:
            if error is None:
                self.end_batch()
        except BaseException as err:
            failure = err
        for callback in reversed(self._started):
            try:
                callback.on_fit_end(error if error is not None else failure)
            except BaseException as err:
                failure = failure or err
        while self._handles:
            self._handles.pop().remove()
        if failure is not None and error is None:
            raise failure

    def remove(self) -> None:
        """Same as `detach()`: every attachment's handle has `remove()`."""
        self.detach()

    @property
    def is_attached(self) -> bool:
        """Whether the driver still emits events."""
        return not self._detached

    def __enter__(self) -> LoopDriver:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, traceback: object) -> None:
        self.detach(exc)


def _overrides(callback: Callback, name: str) -> bool:
    return getattr(type(callback), name) is not getattr(Callback, name)
