"""Regression tests for two foundation fixes the weights tests ran into (hookscope.hooks)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn as nn

from hookscope.hooks import named_modules
from hookscope.hooks._registry import HookRegistry


class _Target:
    cycle: object


@pytest.mark.timeout(30)
def test_a_collection_inside_the_registry_lock_does_not_deadlock() -> None:
    registry = HookRegistry()
    for _ in range(5000):
        target = _Target()
        target.cycle = target  # freed only by the collector, which may run inside the registry's lock
        registry.add("forward", [], target=target)
        del target
    gc.collect()
    assert len(registry) == 0


def test_named_modules_does_not_keep_the_model_alive_without_the_collector() -> None:
    gc.disable()
    try:
        shared = nn.Linear(2, 2)
        model = nn.Sequential(nn.Sequential(shared, nn.ReLU()), nn.Sequential(nn.Linear(2, 2), shared))
        assert [p for p, _ in named_modules(model)] == [p for p, _ in model.named_modules()]
        reference = weakref.ref(model)
        del model, shared
        assert reference() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("mode", ["forward", "step"])
def test_a_constraint_stays_in_force_when_its_handle_is_dropped(mode: str) -> None:
    from hookscope.weights import MaxNorm, register_constraint

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=10.0)
    register_constraint(model, MaxNorm(1.0), mode=mode, optimizer=optimizer if mode == "step" else None)
    gc.collect()
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).sum().backward()
        optimizer.step()
    model(torch.randn(1, 4))  # forward mode projects before each forward
    assert model[0].weight.detach().norm(dim=1).max() <= 1.0 + 1e-5
