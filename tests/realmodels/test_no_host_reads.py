"""The steps between two flushes read nothing on the host, on every real model: on CUDA with
`torch.cuda.set_sync_debug_mode("error")` (where a GPU is lent), and on the meta device, the stand-in that CI
runs.

The models train on the meta device: its tensors have shapes and no values, so every op whose result depends on
values that the host must read (`.item()`, indexing with a 0-d tensor, `nonzero`, a bincount sized by its data)
raises, and every branch that hookscope takes off the CPU is taken. Ops that read values on the host only on
CUDA, to check them (`segment_reduce` with lengths, bincount), have meta kernels that do not: a dispatch mode
names them (`SYNCING`). So are the copies from the host that hookscope makes on the way (on CUDA a copy from
pageable memory waits for the device), other than the pinned, asynchronous ones of `hookscope._transfer`: tensors
made from numbers or lists on the device (`torch.tensor(..., device=...)`, which no dispatch mode sees) and
`.to(device)` of a CPU tensor. The first host read is the flush, where the copy out of a meta tensor fails.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from hookscope.callbacks import ActivationStats
from hookscope.monitors import MonitorPool, OutputGradMonitor, OutputMonitor
from hookscope.reducers import CAReducer, EMAReducer, HistogramReducer, StatsReducer
from hookscope.watch import Watch
from hookscope.weights import UpdateRatioMonitor, add_weight_distribution_monitor, add_weight_update_monitor_hook
from sync_debug import syncs_raise

from .zoo import MODELS, build

aten = torch.ops.aten
SYNCING = {
    aten.bincount.default,
    aten.segment_reduce.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
    aten._local_scalar_dense.default,
}
"""Ops that read their input's values on the host on CUDA (a sync), whatever their meta kernel does."""


ASYNCHRONOUS = "hookscope._transfer.to_device"
"""hookscope's one copy from the host: pinned and asynchronous on CUDA."""


def hookscope_caller(frame: FrameType | None) -> str | None:
    """`module.function` of the innermost hookscope frame from `frame` outwards, or `None`."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("hookscope."):
            return f"{module}.{frame.f_code.co_name}"
        frame = frame.f_back
    return None


class Calls(TorchDispatchMode):
    """What would sync on CUDA while it is on: the `SYNCING` ops called on a tensor off the CPU (on the CPU they read
    memory the host has: AdamW's step count, say), and hookscope's copies from the host (`host_copies`)."""

    def __init__(self) -> None:
        super().__init__()
        self.syncing: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if func in SYNCING and any(t.device.type != "cpu" for t in tensors):
            self.syncing.append(str(func))
        target = (kwargs or {}).get("device")
        if func is aten._to_copy.default and args[0].device.type == "cpu" and target is not None:
            caller = hookscope_caller(sys._getframe(1))
            if torch.device(target).type != "cpu" and caller not in (None, ASYNCHRONOUS):
                self.syncing.append(f"a copy from the host in {caller}")
        return func(*args, **(kwargs or {}))

    @contextmanager
    def host_copies(self) -> Iterator[None]:
        """On, and also naming hookscope's calls of `torch.tensor` and `torch.as_tensor` with a device off the CPU
        (wrapped for the block alone)."""
        with pytest.MonkeyPatch.context() as patch:
            for name in ("tensor", "as_tensor"):
                made = getattr(torch, name)

                def making(*args: Any, made: Any = made, name: str = name, **kwargs: Any) -> Any:
                    device = kwargs.get("device")
                    caller = hookscope_caller(sys._getframe(1))
                    if device is not None and torch.device(device).type != "cpu" and caller:
                        self.syncing.append(f"torch.{name}(..., device={device}) in {caller}")
                    return made(*args, **kwargs)

                patch.setattr(torch, name, making)
            with self:
                yield


MONITORS = {
    "watch defaults": lambda: Watch(),
    "watch every=1": lambda: Watch(every=1),
    "watch every=4": lambda: Watch(every=4),
    "watch every=1, exact": lambda: Watch(every=1, exact=True),
    "ActivationStats every batch, with histograms": lambda: ActivationStats(with_hist=True, budget=None),
}

STEPS = 20
"""The budget's warm-up (16 steps) and a few after it: no flush to the host."""


@dataclass
class Training:
    """Model `name` of the zoo on `device` under a monitor of `MONITORS` (`None`: none), with AdamW and one batch."""

    name: str
    monitor: str | None
    device: str
    capturable: bool = False  # AdamW's step count on the device

    def __post_init__(self) -> None:
        self.spec = MODELS[self.name]
        self.model = build(self.spec).to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3, capturable=self.capturable)
        batch = self.spec.batch(torch.Generator().manual_seed(0))
        self.args, self.kwargs, self.target = pytree.tree_map_only(torch.Tensor, lambda t: t.to(self.device), batch)
        self.monitored = None if self.monitor is None else MONITORS[self.monitor]()
        self.driver: Any = None

    def attach(self) -> Training:
        assert self.monitored is not None
        self.driver = self.monitored.attach(self.model, self.optimizer)
        return self

    def steps(self, count: int = STEPS) -> None:
        """Train `count` steps, each loss logged to a `Watch` once it is attached."""
        for _ in range(count):
            loss = self.spec.loss(self.model(*self.args, **self.kwargs), self.target)
            if isinstance(self.monitored, Watch) and self.driver is not None:
                self.monitored.log_loss(loss)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()


@pytest.mark.parametrize("monitor", list(MONITORS))
@pytest.mark.parametrize("name", list(MODELS))
def test_steps_between_flushes_read_nothing_on_the_host(
    name: str, monitor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in ("hookscope.watch._watch", "hookscope.callbacks._activation_stats"):  # they refuse meta models
        monkeypatch.setattr(importlib.import_module(module), "check_real_device", lambda *args, **kwargs: None)
    training, calls = Training(name, monitor, "meta").attach(), Calls()
    with calls.host_copies():
        training.steps()
    assert calls.syncing == []
    if isinstance(training.monitored, Watch):
        with pytest.raises(NotImplementedError, match="meta"):  # its flush at the end is the first host read
            training.driver.detach()
    else:
        training.driver.detach()
        with pytest.raises(NotImplementedError, match="meta"):  # reading the statistics is the first host read
            _ = training.monitored.stats
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in training.model.modules())


ATTACHMENTS: dict[str, Callable[[nn.Module, torch.optim.Optimizer], Any]] = {
    "UpdateRatioMonitor": lambda model, optimizer: UpdateRatioMonitor().attach(model, optimizer),
    "weight update monitor": lambda model, optimizer: add_weight_update_monitor_hook(optimizer, log_interval=2),
    "weight distribution monitor": lambda model, optimizer: add_weight_distribution_monitor(model),
    "OutputMonitor, HistogramReducer": lambda model, optimizer: MonitorPool(
        OutputMonitor.partialconstructor(HistogramReducer(20)), model
    ),
    "OutputMonitor, fixed-range HistogramReducer": lambda model, optimizer: MonitorPool(
        OutputMonitor.partialconstructor(HistogramReducer(20, (-1.0, 1.0))), model
    ),
    "OutputGradMonitor, StatsReducer": lambda model, optimizer: MonitorPool(
        OutputGradMonitor.partialconstructor(StatsReducer()), model
    ),
    "OutputGradMonitor, EMAReducer": lambda model, optimizer: MonitorPool(
        OutputGradMonitor.partialconstructor(EMAReducer(0.9)), model
    ),
    "OutputMonitor, CAReducer": lambda model, optimizer: MonitorPool(
        OutputMonitor.partialconstructor(CAReducer()), model
    ),
}
"""The other per-step monitors, on a model whose weights are large enough to be sampled (torchvision's ResNet).
The reservoir reducers are not among them: a random generator cannot be made on the meta device."""


@pytest.mark.parametrize("attachment", list(ATTACHMENTS))
def test_weight_and_reducer_monitors_read_nothing_on_the_host(attachment: str) -> None:
    training, calls = Training("tv_resnet", None, "meta"), Calls()
    attached = ATTACHMENTS[attachment](training.model, training.optimizer)
    with calls.host_copies():
        training.steps(12)
    assert calls.syncing == []
    attached.remove()
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in training.model.modules())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("monitor", list(MONITORS))
@pytest.mark.parametrize("name", list(MODELS))
def test_steps_between_flushes_never_sync_on_cuda(name: str, monitor: str) -> None:
    training = Training(name, monitor, "cuda", capturable=True)
    try:
        with syncs_raise():
            training.steps(2)
    except RuntimeError as error:  # the model's own code: hookscope's test cannot tell on it
        if "synchronizing" not in str(error):
            raise
        pytest.skip(f"{name} synchronizes by itself on CUDA: {error}")
    training.attach()
    with syncs_raise():
        training.steps()
    training.driver.detach()
    if isinstance(training.monitored, Watch):
        assert training.monitored.results().meta["measured"]["steps"] == STEPS
    else:
        assert len(training.monitored.stats) == STEPS
