"""Shared helpers for the weights tests (a unique module name: test folders are not packages)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn

_SYNCS = ("item", "tolist", "cpu", "__bool__", "__float__", "__int__", "numpy")


@contextmanager
def forbid_host_sync() -> Iterator[None]:
    """Make every Tensor method that reads a value back to the host raise inside the block."""
    saved = {name: getattr(torch.Tensor, name) for name in _SYNCS}

    def refuse(name: str):  # type: ignore[no-untyped-def]
        def method(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise AssertionError(f"host sync through Tensor.{name} inside a hook")

        return method

    try:
        for name in _SYNCS:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def make_mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor) -> None:
    optimizer.zero_grad()
    model(inputs).square().mean().backward()
    optimizer.step()
