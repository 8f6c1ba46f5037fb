"""The steps between two flushes read nothing on the host, on every real model: on CUDA with
`torch.cuda.set_sync_debug_mode("error")` (where a GPU is lent), and on the meta device, the stand-in that CI
runs.

The models train on the meta device: its tensors have shapes and no values, so every op whose result depends on
values that the host must read (`.item()`, indexing with a 0-d tensor, `nonzero`, a bincount sized by its data)
raises, and every branch that hookscope takes off the CPU is taken. Ops that read values on the host only on
CUDA, to check them (`segment_reduce` with lengths, bincount), have meta kernels that do not: a dispatch mode
names them (`SYNCING`). The first host read is the flush, where the copy out of a meta tensor fails.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from hookscope.callbacks import ActivationStats
from hookscope.watch import Watch

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


class Calls(TorchDispatchMode):
    """The `SYNCING` ops called on a tensor off the CPU while it is on (on the CPU they read memory the host has:
    AdamW's step count, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.syncing: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if func in SYNCING and any(t.device.type != "cpu" for t in tensors):
            self.syncing.append(str(func))
        return func(*args, **(kwargs or {}))


def to_meta(value: Any) -> Any:
    return value.to("meta") if isinstance(value, torch.Tensor) else value


MONITORS = {
    "watch defaults": lambda: Watch(),
    "watch every=1": lambda: Watch(every=1),
    "watch every=4": lambda: Watch(every=4),
    "ActivationStats every batch, with histograms": lambda: ActivationStats(with_hist=True, budget=None),
}


@pytest.mark.parametrize("monitor", list(MONITORS))
@pytest.mark.parametrize("name", list(MODELS))
def test_steps_between_flushes_read_nothing_on_the_host(
    name: str, monitor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in ("hookscope.watch._watch", "hookscope.callbacks._activation_stats"):  # they refuse meta models
        monkeypatch.setattr(importlib.import_module(module), "check_real_device", lambda *args, **kwargs: None)
    spec = MODELS[name]
    model = build(spec).to("meta")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    args, kwargs, target = spec.batch(torch.Generator().manual_seed(0))
    args, kwargs, target = tuple(map(to_meta, args)), {k: to_meta(v) for k, v in kwargs.items()}, to_meta(target)
    monitored = MONITORS[monitor]()
    driver = monitored.attach(model, optimizer)
    calls = Calls()
    with calls:
        for _ in range(20):  # the budget's warm-up (16 steps) and a few after it, no flush to the host
            loss = spec.loss(model(*args, **kwargs), target)
            if isinstance(monitored, Watch):
                monitored.log_loss(loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert calls.syncing == []
    if isinstance(monitored, Watch):
        with pytest.raises(NotImplementedError, match="meta"):  # its flush at the end is the first host read
            driver.detach()
    else:
        driver.detach()
        with pytest.raises(NotImplementedError, match="meta"):  # reading the statistics is the first host read
            _ = monitored.stats
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("monitor", list(MONITORS))
@pytest.mark.parametrize("name", list(MODELS))
def test_steps_between_flushes_never_sync_on_cuda(name: str, monitor: str) -> None:
    spec = MODELS[name]
    model = build(spec).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)  # its step count on the device
    args, kwargs, target = spec.batch(torch.Generator().manual_seed(0))
    args, kwargs, target = tuple(map(to_cuda, args)), {k: to_cuda(v) for k, v in kwargs.items()}, to_cuda(target)
    monitored = MONITORS[monitor]()
    driver = monitored.attach(model, optimizer)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            loss = spec.loss(model(*args, **kwargs), target)
            if isinstance(monitored, Watch):
                monitored.log_loss(loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    driver.detach()
    if isinstance(monitored, Watch):
        assert monitored.results().meta["measured"]["steps"] == 20
    else:
        assert len(monitored.stats) == 20


def to_cuda(value: Any) -> Any:
    return value.cuda() if isinstance(value, torch.Tensor) else value
