"""Run a function on N gloo ranks on loopback (CPU), each in its own process, with a timeout.

Ranks are forked where the platform allows it (as PyTorch's own distributed tests do): they inherit the imported
modules, so torch._dynamo, which DDP and FSDP import when constructed (seconds), is imported once, here.
"""

from __future__ import annotations

import datetime
import importlib
import multiprocessing
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world: int, store: str, fn: Callable[..., Any], args: tuple[Any, ...], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        result = fn(rank, world, *args)
        torch.save(result, f"{out}.{rank}")
    except BaseException:
        with open(f"{out}.{rank}.err", "w") as handle:
            handle.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], *args: Any, world: int = 2) -> list[Any]:
    """Run `fn(rank, world, *args)` on `world` ranks; return each rank's result (tensors/dicts/lists)."""
    can_fork = "fork" in multiprocessing.get_all_start_methods() and not torch.cuda.is_initialized()
    method = "fork" if can_fork else "spawn"  # a forked child of a CUDA process cannot use CUDA
    if method == "fork":
        importlib.import_module("torch._dynamo")
    with tempfile.TemporaryDirectory() as folder:
        store, out = os.path.join(folder, "store"), os.path.join(folder, "out")
        try:
            mp.start_processes(_entry, args=(world, store, fn, args, out), nprocs=world, join=True, start_method=method)
        except Exception as err:
            errors = [Path(f"{out}.{r}.err").read_text() for r in range(world) if os.path.exists(f"{out}.{r}.err")]
            raise AssertionError("a rank failed:\n" + "\n".join(errors)) from err
        return [torch.load(f"{out}.{r}", weights_only=True) for r in range(world)]
