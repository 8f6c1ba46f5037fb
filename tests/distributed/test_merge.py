"""Merges across 2 gloo ranks equal the single-process computation on the whole data."""

from __future__ import annotations

from typing import Any

import torch

from hookscope.distributed import all_reduce, combine_ranks, merge_records, norm_of_shards, union_keys
from hookscope.stats._describe import describe
from hookscope.stats._record import Column
from hookscope.stats._spec import Spec

from .launch import run_ranks


def _records(x: torch.Tensor) -> torch.Tensor:
    """(columns, RECORD) records of each column of `x`."""
    return torch.stack([describe(x[:, j], Spec()).record for j in range(x.shape[1])])


def _moments(records: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, sum of squared deviations) of records."""
    count, mean = records[:, Column.COUNT], records[:, Column.MEAN]
    return count, mean, records[:, Column.DEVIATION].square() * count


def _oracle(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = x.double()
    mean = x.mean(0)
    return torch.full(x.shape[1:], float(x.shape[0]), dtype=torch.float64), mean, ((x - mean) ** 2).sum(0)


def _ranks_body(rank: int, world: int) -> dict[str, Any]:
    torch.manual_seed(0)
    data = torch.randn(10, 3) * 5 + 2
    halves = [data[:7], data[7:]] if world == 2 else [data]
    mine = halves[rank]
    count, mean, m2 = _moments(merge_records(_records(mine)))
    keys = union_keys(["a", "b"] if rank == 0 else ["c", "a"])
    empty = _moments(merge_records(_records(mine[:0] if rank == 1 else mine)))  # rank 1 saw nothing
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
    count, mean, m2 = _oracle(data)
    for got in results:
        assert torch.equal(got["count"], count)
        assert torch.allclose(got["mean"], mean) and torch.allclose(got["m2"], m2)
        assert got["keys"] == ["a", "b", "c"]
        assert torch.equal(got["empty_count"], torch.full((3,), 7.0, dtype=torch.float64))
        assert torch.allclose(got["empty_mean"], data[:7].double().mean(0))
        assert torch.allclose(got["norm"], data.double().norm())
        assert torch.equal(got["min"], data.min(0).values) and torch.equal(got["max"], data.max(0).values)


def test_ranks_combine_to_the_whole_and_outside_distributed_merging_is_identity() -> None:
    x = torch.randn(50, 4, dtype=torch.float64)
    merged = _moments(combine_ranks(torch.stack([_records(x[:13]), _records(x[13:])])))
    assert all(torch.allclose(a, b) for a, b in zip(merged, _oracle(x), strict=True))
    nothing = _moments(combine_ranks(torch.stack([_records(x[:0]), _records(x[:0])])))
    assert torch.equal(nothing[0], torch.zeros(4, dtype=torch.float64)) and not nothing[1].isnan().any()
    whole = _records(x)
    assert torch.equal(merge_records(whole).nan_to_num(), whole.nan_to_num())
    assert union_keys(["b", "a", "b"]) == ["b", "a"]
