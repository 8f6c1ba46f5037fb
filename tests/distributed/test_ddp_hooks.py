"""Hooks on a DDP-wrapped model: same normalized paths as the unwrapped model; `gather=True` joins ranks."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from hookscope.hooks import Hook, named_modules, select_modules

from .launch import run_ranks


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _body(rank: int, world: int) -> dict[str, Any]:
    model = _model()
    plain_paths = [p for p, _ in named_modules(model)]
    with Hook(model[0], lambda m, i, o: o, gather=True) as before_wrap:
        ddp = DistributedDataParallel(model)
        wrapped_paths = [p for p, _ in named_modules(ddp)]
        chosen = [p for p, _ in select_modules(ddp, "2")]
        data = torch.arange(10 * 3, dtype=torch.float32).reshape(10, 3) / 10
        mine = data[:6] if rank == 0 else data[6:]  # unequal halves
        with Hook(select_modules(ddp, "0")[0][1], lambda m, i, o: o, gather=True) as after_wrap:
            ddp(mine).sum().backward()
    return {
        "plain": plain_paths, "wrapped": wrapped_paths, "chosen": chosen,
        "before": before_wrap.stored, "after": after_wrap.stored,
    }  # fmt: skip


def test_paths_match_and_gather_concatenates_both_ranks_in_rank_order() -> None:
    results = run_ranks(_body)
    model = _model()
    data = torch.arange(10 * 3, dtype=torch.float32).reshape(10, 3) / 10
    expected = model[0](data).detach()
    for got in results:
        assert got["wrapped"] == got["plain"] == ["", "0", "1", "2"]
        assert got["chosen"] == ["2"]
        assert torch.allclose(got["before"], expected) and torch.allclose(got["after"], expected)
