"""`syncs_raise()`: any host-device synchronization inside the block raises (CUDA's sync debug mode), for the CUDA
tests that steps between flushes never sync (tests/watch/test_watch_cuda.py, tests/realmodels/test_no_host_reads.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def syncs_raise() -> Iterator[None]:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
