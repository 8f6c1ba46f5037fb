"""A DDP-wrapped model takes the same site paths: recording, patching and training with an intervention give what
the unwrapped model gives (gloo, 2 ranks on CPU)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from distributed.launch import run_ranks
from hookscope import steer

from .models import AttentionOnly, _batch, induction_pair

HEAD = {"blocks.0.attn.out_proj": steer.Zero(heads=[1], n_heads=2)}


def _loss(model: nn.Module, tokens: torch.Tensor, predictable: torch.Tensor) -> torch.Tensor:
    logits = model(tokens)[:, :-1]
    return nn.functional.cross_entropy(logits[predictable], tokens[:, 1:][predictable])


def _steps(model: nn.Module, rank: int | None, steps: int = 3) -> None:
    gen = torch.Generator().manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        tokens, predictable = _batch(gen, batch=8)
        halves = [(tokens[r * 4 : (r + 1) * 4], predictable[r * 4 : (r + 1) * 4]) for r in range(2)]
        if rank is not None:  # each rank takes its half of the batch; DDP averages the gradients
            loss = _loss(model, *halves[rank])
        else:  # one process: the mean of the two halves' losses
            loss = (_loss(model, *halves[0]) + _loss(model, *halves[1])) / 2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _body(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    ddp = DistributedDataParallel(AttentionOnly())
    clean, corrupted, metric, _ = induction_pair(4)
    with torch.no_grad(), steer.record(ddp, "blocks.*") as rec:
        ddp(clean)
    result = steer.patch(ddp.eval(), clean, corrupted, metric, select="blocks.1.resid_pre", positions="each")
    ddp.train()
    with steer.intervene(ddp, HEAD, at="input") as steering:
        sites = list(steering.sites)
        _steps(ddp, rank)
    return {
        "recorded": dict(rec), "effects": result.effects, "sites": sites,
        "params": {name: p.detach().clone() for name, p in ddp.module.named_parameters()},
    }  # fmt: skip


@pytest.mark.slow
def test_ddp_paths_records_patches_and_training_match_the_plain_model() -> None:
    results = run_ranks(_body)
    torch.manual_seed(0)
    plain = AttentionOnly()
    start = copy.deepcopy(plain)
    clean, corrupted, metric, _ = induction_pair(4)
    with torch.no_grad(), steer.record(plain, "blocks.*") as rec:
        plain(clean)
    effects = steer.patch(plain.eval(), clean, corrupted, metric, select="blocks.1.resid_pre", positions="each").effects
    reference = start.train()
    with steer.intervene(reference, HEAD, at="input"):
        _steps(reference, None)  # the whole batch in one process: what DDP's averaged gradients give
    for got in results:
        assert got["sites"] == ["blocks.0.attn.out_proj"]
        assert list(got["recorded"]) == ["blocks.0", "blocks.1"]
        assert all(torch.equal(got["recorded"][path], rec[path]) for path in rec)
        assert torch.allclose(got["effects"], effects, atol=1e-9)
        for name, parameter in reference.named_parameters():
            assert torch.allclose(got["params"][name], parameter, atol=1e-5), name
    assert all(torch.equal(results[0]["params"][n], results[1]["params"][n]) for n in results[0]["params"])
