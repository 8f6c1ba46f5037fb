"""hookscope's own gloo group lives exactly as long as torch's registry keeps it: `destroy_process_group()` frees
it there and then, as every other group. A process group kept alive past its destruction until interpreter
teardown made ranks abort at exit ("terminate called without an active exception", exit code -6: the flake of
tests/distributed/test_ddp_example.py); this checks the cause, not the flake's symptom, which no test can repeat
often enough to be sure."""

from __future__ import annotations

import gc
import socket
import weakref

import torch
import torch.distributed as dist

from hookscope.distributed import DEFAULT_TIMEOUT, _group, all_reduce

from .launch import run_ranks


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _body(rank: int, world: int, port: int) -> list[float]:
    total = all_reduce(torch.tensor([rank + 1.0]))  # makes hookscope's group
    group, default = weakref.ref(_group(DEFAULT_TIMEOUT)), weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    gc.collect()
    freed = float(group() is None and default() is None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    again = all_reduce(torch.tensor([rank + 1.0]))  # a new default group: hookscope makes a new group of its own
    return [float(total), freed, float(again)]


def test_destroy_process_group_frees_hookscopes_group() -> None:
    results = run_ranks(_body, _free_port())
    assert results == [[3.0, 1.0, 3.0], [3.0, 1.0, 3.0]]
