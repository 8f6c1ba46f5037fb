"""Run hookscope callbacks inside Lightning's `Trainer.fit`: `HookscopeLightningCallback(*callbacks)`.

Events: `on_fit_start` -> `on_fit_start(pl_module, trainer.optimizers[0])`; each training batch ->
`on_batch_start`/`on_batch_end` (batches counted over the whole fit, not per epoch; the step's loss, the sum of
its batches' losses as Lightning backwards them (divided by `accumulate_grad_batches`), that is their mean, goes
to `watch().log_loss`); `on_after_backward` -> `after_backward`; `on_before_optimizer_step` ->
`before_optimizer_step` (before gradient clipping, after AMP unscaling); the optimizer's own step hook ->
`after_optimizer_step`; `on_fit_end` or `on_exception` -> `on_fit_end`. Validation batches are not training
batches, so they are not recorded.
"""

from __future__ import annotations

from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - depends on the environment
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ImportError as err:
        raise ImportError(
            "hookscope.integrations.lightning needs Lightning: pip install 'hookscope[lightning]'"
        ) from err

import torch

from ..callbacks._base import Callback
from ._common import EventRelay

__all__ = ["HookscopeLightningCallback"]


class HookscopeLightningCallback(pl.Callback):
    """A Lightning `Callback` that drives hookscope callbacks during `Trainer.fit`.

    Args:
        *callbacks: hookscope callbacks (`hookscope.watch(model)`, `ActivationStats()`, `HookCallback(...)`).

    Raises:
        TypeError: no callback, or one that is not a `hookscope.callbacks.Callback`.

    Example:
        >>> from hookscope import ActivationStats
        >>> stats = ActivationStats()
        >>> callback = HookscopeLightningCallback(stats)  # Trainer(callbacks=[callback]).fit(module)
    """

    def __init__(self, *callbacks: Callback) -> None:
        super().__init__()
        self.relay = EventRelay(callbacks, "HookscopeLightningCallback")

    @property
    def callbacks(self) -> tuple[Callback, ...]:
        """The hookscope callbacks this relays to."""
        return self.relay.callbacks

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Start the callbacks on the LightningModule with the trainer's first optimizer."""
        optimizers = list(getattr(trainer, "optimizers", None) or [])
        optimizer = optimizers[0] if optimizers else None
        self.relay.fit_start(pl_module, optimizer, watch_steps=True)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """Begin a training batch."""
        if self.relay.is_running:
            self.relay.batch_start()

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        """Relay `after_backward`."""
        if self.relay.is_running:
            self.relay.after_backward()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: torch.optim.Optimizer) -> None:
        """Relay `before_optimizer_step`."""
        if self.relay.is_running:
            self.relay.before_optimizer_step(optimizer)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """End the training batch, handing its loss over."""
        if self.relay.is_running:
            self.relay.batch_end(_loss(outputs))

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """End the callbacks (remove their hooks, flush)."""
        if self.relay.is_running:
            self.relay.fit_end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """End the callbacks when the fit raises, so no hook is left behind."""
        if self.relay.is_running:
            self.relay.fit_end(exception)

    def state_dict(self) -> dict[str, Any]:
        """The last batch's number and the callbacks' states (saved in Lightning checkpoints)."""
        return self.relay.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the last batch's number and the callbacks' states from a checkpoint."""
        self.relay.load_state_dict(state_dict)


def _loss(outputs: Any) -> torch.Tensor | None:
    if isinstance(outputs, torch.Tensor):
        return outputs
    loss = outputs.get("loss") if isinstance(outputs, dict) else None
    return loss if isinstance(loss, torch.Tensor) else None
