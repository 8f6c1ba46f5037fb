"""Shared test set-up: one torch thread per xdist worker (2 cores), a fixed seed per test, and hookscope strict.

`HOOKSCOPE_STRICT=1`: a failure inside hookscope's own hooks raises in the tests (and in the scripts they start)
instead of being counted and warned about, so no bug hides behind the containment; tests of the containment
itself pass `strict=False`.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HOOKSCOPE_STRICT", "1")
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
