"""Shared test set-up: one torch thread per xdist worker (2 cores), a fixed seed per test."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
