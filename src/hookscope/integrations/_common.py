"""What both trainer integrations share: the callbacks they drive, the numbers of their batches, exception-safe
ends, and the loss of each step.

The loss of a step is the sum of the losses its backwards used: trainers divide each micro-batch's loss by the
number of micro-batches of gradient accumulation before `backward`, so the sum over a step's micro-batches is the
mean loss of its samples, what the trainer itself reports. It is handed to `log_loss` once per optimizer step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ..callbacks._base import BatchNumbers, Callback
from ..hooks import HookHandle, register_optimizer_hook

__all__ = ["EventRelay"]


class EventRelay:
    """Forward trainer events to hookscope callbacks, numbering training batches over the whole run."""

    def __init__(self, callbacks: tuple[Callback, ...], owner: str) -> None:
        if not callbacks:
            raise TypeError(f"{owner} needs at least one hookscope callback, e.g. {owner}(hookscope.watch(model))")
        for callback in callbacks:
            if not isinstance(callback, Callback):
                raise TypeError(
                    f"callbacks must be hookscope Callback objects (watch(), ActivationStats, HookCallback ...), "
                    f"got {type(callback).__name__}"
                )
        self.callbacks = callbacks
        self._numbers = BatchNumbers(callbacks)
        self.is_running = False
        self.optimizer: torch.optim.Optimizer | None = None
        self._handles: list[HookHandle] = []
        self._started: list[Callback] = []
        self._loss: torch.Tensor | None = None  # the losses of the step's batches so far (on the device)
        self._stepped = False  # the optimizer stepped during this batch

    def fit_start(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, watch_steps: bool) -> None:
        """Start every callback; with `watch_steps`, relay `after_optimizer_step` from an optimizer hook."""
        self.optimizer = optimizer
        try:
            if optimizer is not None and watch_steps:
                hook = register_optimizer_hook(optimizer, "step_post", self._step_post, owner=self, tags=("trainer",))
                self._handles.append(hook)
            for callback in self.callbacks:
                callback.on_fit_start(model, optimizer)
                self._started.append(callback)
        except BaseException as err:
            self.fit_end(err)
            raise
        self.is_running = True

    def _step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.after_optimizer_step(optimizer)

    @property
    def batch(self) -> int:
        """The number of the open (or last) training batch, from 0 over the run (-1: none yet); a watch among the
        callbacks keeps the count (`BatchNumbers`)."""
        return self._numbers.current

    def batch_start(self) -> None:
        """Begin the next training batch."""
        batch = self._numbers.begin()
        for callback in self.callbacks:
            callback.on_batch_start(batch)

    def add_loss(self, loss: torch.Tensor) -> None:
        """Add `loss` (a loss a backward of this batch used) to the step's loss."""
        value = loss.detach().float().sum()
        self._loss = value if self._loss is None else self._loss + value.to(self._loss.device)

    def batch_end(self, loss: Any = None) -> None:
        """End the current training batch, whose backward used `loss` (divided by the trainer for gradient
        accumulation); once the optimizer stepped, hand the step's summed loss to callbacks that log losses."""
        if isinstance(loss, torch.Tensor):
            self.add_loss(loss)
        if self._loss is not None and (self._stepped or self.optimizer is None):
            for callback in self.callbacks:
                log_loss = getattr(callback, "log_loss", None)
                if callable(log_loss):
                    log_loss(self._loss)
            self._loss = None
        self._stepped = False
        for callback in self.callbacks:
            callback.on_batch_end(self._numbers.opened)

    def after_backward(self) -> None:
        """Relay `after_backward`."""
        for callback in self.callbacks:
            callback.after_backward()

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Relay `before_optimizer_step`."""
        for callback in self.callbacks:
            callback.before_optimizer_step(optimizer)

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Relay `after_optimizer_step`."""
        self._stepped = True
        for callback in self.callbacks:
            callback.after_optimizer_step(optimizer)

    def fit_end(self, error: BaseException | None = None) -> None:
        """End every started callback (all of them, even when one raises) and remove the relay's hooks."""
        self.is_running = False
        failure: BaseException | None = None
        for callback in reversed(self._started):
            try:
                callback.on_fit_end(error)
            except BaseException as err:
                failure = failure or err
        self._started.clear()
        while self._handles:
            self._handles.pop().remove()
        if failure is not None and error is None:
            raise failure

    def state_dict(self) -> dict[str, Any]:
        """The number of the last batch (followed from a watch among the callbacks, when one keeps the count) and each
        callback's state."""
        return {"batch": self.batch, "callbacks": [c.state_dict() for c in self.callbacks]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned.

        Raises:
            ValueError: the state holds another number of callbacks.
        """
        states = state.get("callbacks", [])
        if len(states) != len(self.callbacks):
            raise ValueError(f"state must hold {len(self.callbacks)} callback states, got {len(states)}")
        self._numbers.restore(int(state.get("batch", -1)))
        for callback, callback_state in zip(self.callbacks, states, strict=True):
            callback.load_state_dict(callback_state)
