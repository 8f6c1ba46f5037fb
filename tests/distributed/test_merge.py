"""Merges across 2 gloo ranks equal the single-process computation on the whole data."""

from __future__ import annotations

from typing import Any

import torch

from hookscope.distributed import all_reduce, chan_merge, merge_moments, norm_of_shards, union_keys

from .launch import run_ranks


def _moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = x.double()
    n = torch.tensor(float(x.shape[0]), dtype=torch.float64).expand(x.shape[1:])
    mean = x.mean(0) if x.shape[0] else torch.zeros(x.shape[1:], dtype=torch.float64)
    return n, mean, ((x - mean) ** 2).sum(0)


def _ranks_body(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    data = torch.randn(10, 3) * 5 + 2
    halves = [data[:7], data[7:]] if world == 2 else [data]
    mine = halves[rank]
    count, mean, m2 = merge_moments(*_moments(mine))
    keys = union_keys(["a", "b"] if rank == 0 else ["c", "a"])
    empty = merge_moments(*_moments(mine[:0] if rank == 1 else mine))  # rank 1 saw nothing
    return {
        "count": count, "mean": mean, "m2": m2, "keys": keys,
        "empty_count": empty[0], "empty_mean": empty[1],
        "norm": norm_of_shards(mine.double().square().sum()),
        "min": all_reduce(mine.min(0).values, "min"), "max": all_reduce(mine.max(0).values, "max"),
    }  # fmt: skip


def test_two_ranks_merge_exactly_like_one_process() -> None:
    torch.manual_seed(0)
    data = torch.randn(10, 3) * 5 + 2
    results = run_ranks(_ranks_body)
    count, mean, m2 = _moments(data)
    for got in results:
        assert torch.equal(got["count"], count)
        assert torch.allclose(got["mean"], mean) and torch.allclose(got["m2"], m2)
        assert got["keys"] == ["a", "b", "c"]
        assert torch.equal(got["empty_count"], torch.full((3,), 7.0, dtype=torch.float64))
        assert torch.allclose(got["empty_mean"], data[:7].double().mean(0))
        assert torch.allclose(got["norm"], data.double().norm())
        assert torch.equal(got["min"], data.min(0).values) and torch.equal(got["max"], data.max(0).values)


def test_chan_merge_of_parts_equals_whole_and_outside_distributed_is_identity() -> None:
    x = torch.randn(50, 4, dtype=torch.float64)
    merged = chan_merge(_moments(x[:13]), _moments(x[13:]))
    whole = _moments(x)
    assert all(torch.allclose(a, b) for a, b in zip(merged, whole, strict=True))
    nothing = chan_merge(_moments(x[:0]), _moments(x[:0]))
    assert torch.equal(nothing[0], torch.zeros(4, dtype=torch.float64)) and not nothing[1].isnan().any()
    assert all(torch.equal(a, b) for a, b in zip(merge_moments(*whole), whole, strict=True))
    assert union_keys(["b", "a", "b"]) == ["b", "a"]
