"""Run hookscope callbacks inside a Hugging Face `Trainer.train`: `HookscopeTrainerCallback(*callbacks)`.

Events: `on_train_begin` -> `on_fit_start(model, optimizer)`; `on_step_begin`/`on_step_end` ->
`on_batch_start`/`on_batch_end` (one "batch" per optimizer step: the micro-batches of gradient accumulation
merge into it); `on_pre_optimizer_step` -> `after_backward` then `before_optimizer_step` (after gradient
clipping); `on_optimizer_step` -> `after_optimizer_step`; `on_train_end` -> `on_fit_end`. Evaluation is not a
training step, so it is not recorded. The Trainer has no exception event: when `train()` raises, call
`callback.close()` (or use `with callback:`) to remove the hooks.

The Trainer hands no loss to its callbacks: the loss is read from the model's output (`outputs.loss`, there when
the inputs hold labels), as the Trainer backwards it: a gradient hook on it gets d(backwarded loss) / d(loss),
the factor the Trainer divided it by for gradient accumulation, so each micro-batch adds `loss * factor` and the
step's loss is their sum, the mean loss the Trainer reports. A model that returns no loss (a `compute_loss_func`)
gets a warning, and no losses.
"""

from __future__ import annotations

from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "hookscope.integrations.transformers needs transformers: pip install 'hookscope[transformers]'"
    ) from err

import warnings

import torch

from .._errors import HookscopeWarning
from ..callbacks._base import Callback
from ..hooks import HookHandle, register_module_hook
from ..hooks._calls import HookErrors
from ._common import EventRelay

__all__ = ["HookscopeTrainerCallback"]


class HookscopeTrainerCallback(TrainerCallback):
    """A Hugging Face `TrainerCallback` that drives hookscope callbacks during `Trainer.train`.

    Args:
        *callbacks: hookscope callbacks (`hookscope.watch(model)`, `ActivationStats()`, `HookCallback(...)`).

    Raises:
        TypeError: no callback, or one that is not a `hookscope.callbacks.Callback`.

    Example:
        >>> from hookscope import ActivationStats
        >>> callback = HookscopeTrainerCallback(ActivationStats())  # Trainer(..., callbacks=[callback])
    """

    def __init__(self, *callbacks: Callback) -> None:
        self.relay = EventRelay(callbacks, "HookscopeTrainerCallback")
        self.errors = HookErrors("HookscopeTrainerCallback", counter="callback.errors.failures")
        self._handle: HookHandle | None = None
        self._losses = 0  # losses read from the model's outputs

    @property
    def callbacks(self) -> tuple[Callback, ...]:
        """The hookscope callbacks this relays to."""
        return self.relay.callbacks

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start the callbacks on the Trainer's model and optimizer."""
        if not self.relay.is_running:
            model = kwargs["model"]
            self.relay.fit_start(model, kwargs.get("optimizer"), watch_steps=False)
            self._handle = register_module_hook(
                model, "forward", self._read_loss, owner=self, tags=("trainer",), errors=self.errors
            )

    def _read_loss(self, module: Any, args: Any, output: Any) -> None:
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and loss.requires_grad and self.relay.is_running:
            value = loss.detach()
            relay = self.relay

            def backwarded(grad: torch.Tensor) -> None:  # grad: d(the loss the Trainer backwards) / d(loss)
                relay.add_loss(value * grad)

            loss.register_hook(self.errors.guard(backwarded, "loss hook"))  # type: ignore[no-untyped-call]
            self._losses += 1

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Begin a training step (all its gradient-accumulation micro-batches)."""
        if self.relay.is_running:
            self.relay.batch_start()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Relay `after_backward` (the last micro-batch's backward is done) and `before_optimizer_step`."""
        if self.relay.is_running:
            self.relay.after_backward()
            optimizer = kwargs.get("optimizer")
            if optimizer is not None:
                self.relay.before_optimizer_step(optimizer)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Relay `after_optimizer_step`."""
        optimizer = kwargs.get("optimizer")
        if self.relay.is_running and optimizer is not None:
            self.relay.after_optimizer_step(optimizer)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """End the training step (its loss goes to `watch().log_loss`)."""
        if self.relay.is_running:
            if not self._losses and self._handle is not None:
                self._handle.remove()
                self._handle = None
                warnings.warn(
                    "HookscopeTrainerCallback: the model's outputs hold no loss (a compute_loss_func, or inputs "
                    "without labels), so no loss is recorded; log it with watch.log_loss(loss) in your loss function",
                    HookscopeWarning,
                    stacklevel=2,
                )
            self.relay.batch_end()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """End the callbacks (remove their hooks, flush)."""
        self.close()

    def close(self, error: BaseException | None = None) -> None:
        """End the callbacks now (also after `train()` raised); calling it again does nothing."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self.relay.is_running:
            self.relay.fit_end(error)

    def __enter__(self) -> HookscopeTrainerCallback:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, traceback: object) -> None:
        self.close(exc)
