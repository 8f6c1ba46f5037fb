"""The demo's training run: the digits CNN trained with watch(), ActivationStats and the weight update monitor."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..callbacks._activation_stats import ActivationStats
from ..hooks._select import has_own_params
from ..results._results import WatchResults
from ..watch._api import watch
from ..watch._watch import ACTIVATION_TYPES
from ..weights._updates import add_weight_update_monitor_hook
from ._data import load_digits_split
from ._model import DigitsCNN, UnsafeSqrt, apply_fault

__all__ = ["DemoConfig", "DemoRun", "evaluate", "train_demo"]

Progress = Callable[[int, int, float | None], None]
"""`progress(done_batches, total_batches, epoch_loss or None)`: called after each batch (loss at epoch ends)."""


@dataclass(frozen=True)
class DemoConfig:
    """What the demo trains: epochs, batch size, Adam's learning rate, seed and the planted fault (or None)."""

    epochs: int = 8
    batch_size: int = 32
    lr: float = 3e-3
    seed: int = 0
    fault: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f"epochs must be a positive int, got {self.epochs!r}")


@dataclass
class DemoRun:
    """What one demo run produced (everything already on the CPU)."""

    config: DemoConfig
    model: DigitsCNN
    results: WatchResults
    accuracy: float
    seconds: float
    lr: float
    activation_stats: ActivationStats
    test_size: int = 0
    updates: dict[str, Any] = field(default_factory=dict)


def _watched(path: str, module: nn.Module) -> bool:
    return has_own_params(module) or isinstance(module, (*ACTIVATION_TYPES, UnsafeSqrt))


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Return the accuracy of `model` on `(x, y)`, in eval mode without gradients (the mode is restored)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return float((model(x).argmax(dim=1) == y).float().mean())
    finally:
        model.train(was_training)


def train_demo(
    config: DemoConfig, progress: Progress | None = None, on_model: Callable[[nn.Module], None] | None = None
) -> DemoRun:
    """Train the digits CNN as `config` says, with every monitor on; return what it recorded.

    `on_model(model)` is called with the model (fault planted) before training starts, e.g. to print its summary.

    Raises:
        ValueError: `config.fault` is not one of `FAULTS`.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains fastest on one thread (and far faster on a busy machine)
    try:
        return _train(config, progress, on_model)
    finally:
        torch.set_num_threads(threads)


def _train(config: DemoConfig, progress: Progress | None, on_model: Callable[[nn.Module], None] | None) -> DemoRun:
    torch.manual_seed(config.seed)
    x_train, y_train, x_test, y_test = load_digits_split(seed=config.seed)
    model = DigitsCNN()
    lr = config.lr * apply_fault(model, config.fault)
    optimizer = torch.optim.Adam(model.named_parameters(), lr=lr)
    if on_model is not None:
        on_model(model)
    stats = ActivationStats()
    updates = add_weight_update_monitor_hook(optimizer, log_interval=10)
    started = time.perf_counter()
    try:
        with watch(model, optimizer, select=_watched, every=1) as watcher, stats.attach(model, optimizer):
            _fit(model, optimizer, watcher, (x_train, y_train), config, progress)
    finally:
        updates["remove"]()
    seconds = time.perf_counter() - started
    accuracy = evaluate(model, x_test, y_test)
    return DemoRun(config, model, watcher.results(), accuracy, seconds, lr, stats, len(y_test), updates)


def _fit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    watcher: Any,
    data: tuple[torch.Tensor, torch.Tensor],
    config: DemoConfig,
    progress: Progress | None,
) -> None:
    x, y = data
    generator = torch.Generator().manual_seed(config.seed)
    per_epoch = -(-len(y) // config.batch_size)
    model.train()
    for epoch in range(config.epochs):
        order = torch.randperm(len(y), generator=generator)
        total = torch.zeros(())  # summed on the device: read once per epoch, not per batch
        for start in range(0, len(y), config.batch_size):
            batch = order[start : start + config.batch_size]
            loss = F.cross_entropy(model(x[batch]), y[batch])
            watcher.log_loss(loss)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            total += loss.detach()
            done = epoch * per_epoch + start // config.batch_size + 1
            last = start + config.batch_size >= len(y)
            if progress is not None:
                progress(done, config.epochs * per_epoch, float(total) / per_epoch if last else None)
