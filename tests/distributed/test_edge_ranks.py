"""Ranks that differ: an empty batch, no monitored layers, other layers (E2, E6), nothing recorded at all; and
a max-norm constraint under DDP that keeps replicas identical, where a rank-0-only constraint is detected (E3).

One spawned run; every merge must complete on both ranks (the collectives have a timeout, so a rank missing
from one fails the run instead of hanging it).
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from hookscope.callbacks import ActivationStats
from hookscope.callbacks._merge import merge_activation_stats
from hookscope.distributed import check_replicas, grad_norms, merge_stats_reducer, union_keys
from hookscope.reducers import StatsReducer
from hookscope.results import WatchResults, merge_results
from hookscope.stats._record import RECORD
from hookscope.watch import watch
from hookscope.weights import MaxNorm, register_constraint

from .launch import run_ranks

ROWS, SPLIT, STEPS = 12, 7, 4


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2))


def _batch() -> torch.Tensor:
    return torch.randn(ROWS, 3, generator=torch.Generator().manual_seed(2))


def _rows(rank: int, empty_rank: int | None = None) -> torch.Tensor:
    if rank == empty_rank:
        return _batch()[:0]
    return _batch()[:SPLIT] if rank == 0 else _batch()[SPLIT:]


def _flat(results: WatchResults) -> dict[str, Any]:
    """The merged activations and layer names, as plain tensors and lists (what rank results may hold)."""
    table = {f"{path}/{stat}": s for path, stats in results.activations.items() for stat, s in stats.items()}
    return {"layers": list(results.layers), "activations": table, "dropped": dict(results.dropped)}


def _observe(rank: int, select: Any, stats_modules: Any, empty_rank: int | None) -> tuple[dict[str, Any], Any]:
    """Two DDP steps (no optimizer) under `watch(select=...)` and `ActivationStats(modules=...)`, merged."""
    ddp = DistributedDataParallel(_model())
    stats = ActivationStats(modules=stats_modules, hist_range=(-3.0, 3.0), with_hist=True)
    with watch(ddp, select=select) as w, stats.attach(ddp):
        ddp(_rows(rank)).pow(2).sum().backward()
        ddp(_rows(rank, empty_rank)).pow(2).sum().backward()  # step 1: `empty_rank` gets no rows
    return _flat(merge_results(w.results())), merge_activation_stats(stats).state_dict()


def _constrained(rank: int, everywhere: bool) -> dict[str, Any]:
    """N SGD steps with a large learning rate under MaxNorm (on every rank, or on rank 0 only)."""
    ddp = DistributedDataParallel(_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=2.0)
    handle = register_constraint(ddp, MaxNorm(0.5), mode="step", optimizer=opt) if everywhere or rank == 0 else None
    for _ in range(STEPS):
        ddp(_rows(rank)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    norms = torch.stack([m.weight.detach().norm(dim=1).max() for m in (ddp.module[0], ddp.module[2])])
    corrections = sum(handle.corrections.values()) if handle is not None else 0
    return {"differ": check_replicas(ddp), "max_norms": norms, "corrections": corrections}


def _body(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["empty_batch"], out["empty_batch_stats"] = _observe(rank, None, None, empty_rank=1)
    other = ["0"] if rank == 0 else ["2"]  # E6: different layers per rank
    out["other_layers"], out["other_layers_stats"] = _observe(rank, other, other, empty_rank=None)
    nothing = (lambda path, module: False) if rank == 1 else None  # E2: rank 1 monitors no layer
    out["no_layers"], out["no_layers_stats"] = _observe(rank, nothing, nothing, empty_rank=None)
    out["never_recorded"] = _flat(merge_results(_model_results() if rank == 0 else WatchResults()))
    out["keys"] = union_keys([] if rank == 1 else ["a"])
    out["replicas_ok"], out["replicas_rank0_only"] = _constrained(rank, True), _constrained(rank, False)
    ddp = DistributedDataParallel(_model())
    ddp(_rows(rank)).pow(2).sum().backward()
    out["grad_norms"] = grad_norms(ddp)
    halves, alone = StatsReducer(), StatsReducer()
    halves.push(_rows(rank))
    if rank == 0:
        alone.push(_rows(rank))  # rank 1's reducer saw nothing
    out["reducer"] = merge_stats_reducer(halves).peek().as_dict()  # type: ignore[union-attr]
    out["reducer_alone"] = merge_stats_reducer(alone).peek().as_dict()  # type: ignore[union-attr]
    out["missing_rank"] = _missing_rank(rank)
    return out


def _missing_rank(rank: int) -> str:
    """Rank 1 never calls the merge: rank 0's collective fails after its timeout instead of hanging."""
    short = datetime.timedelta(seconds=2)
    union_keys([], timeout=short)  # every rank makes the group with this timeout (new_group is collective)
    error = ""
    if rank == 0:
        try:
            merge_results(WatchResults(), timeout=short)
        except RuntimeError as err:
            error = str(err)
    dist.barrier()  # rank 1 waits here on the default group until rank 0 is done
    return error


def _model_results() -> WatchResults:
    model = _model()
    with watch(model) as w:
        model(_batch()[:SPLIT]).sum().backward()
    return w.results()


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_ranks(_body)


def _oracle(rows: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
    """Mean, unbiased std, min, max, count of each layer's output on `rows` (step 0), from the plain model."""
    model, out, x = _model(), {}, rows
    for path, layer in zip("012", model, strict=True):
        x = layer(x).detach()
        out[path] = {"mean": x.mean(), "std": x.std(), "min": x.min(), "max": x.max(), "count": x.numel()}
    return out


def _check(table: dict[str, torch.Tensor], path: str, want: dict[str, Any], step: int = 0) -> None:
    for stat, value in want.items():
        got = float(table[f"{path}/{stat}"][step])
        assert abs(got - float(value)) <= 1e-5 + 1e-5 * abs(float(value)), (path, stat, got, value)


def test_a_rank_with_an_empty_batch_adds_nothing(ranks: list[dict[str, Any]]) -> None:
    whole, want = _oracle(_batch()), _oracle(_batch()[:SPLIT])
    for got in ranks:
        assert got["empty_batch"]["layers"] == ["0", "1", "2"]
        for path in "012":
            _check(got["empty_batch"]["activations"], path, whole[path], step=0)
            _check(got["empty_batch"]["activations"], path, want[path], step=1)  # rank 1's batch was empty
        stats = ActivationStats(hist_range=(-3.0, 3.0), with_hist=True)
        stats.load_state_dict(got["empty_batch_stats"])
        counts = stats.state_dict()["tensors"]["records"][..., RECORD.index("count")]
        assert stats.paths == ["0", "2"] and counts[1].tolist() == [want["0"]["count"], want["2"]["count"]]
        assert abs(stats.stats[1][1]["std"] - float(want["2"]["std"])) < 1e-5
        assert abs(stats.stats[0][1]["std"] - float(whole["2"]["std"])) < 1e-5
        assert stats.hist(1).expm1().sum(0).round().tolist() == [whole["2"]["count"], want["2"]["count"]]
    assert _same(ranks[0]["empty_batch"], ranks[1]["empty_batch"])


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["layers"] == b["layers"] and all(
        torch.equal(a["activations"][k].nan_to_num(), b["activations"][k].nan_to_num()) for k in a["activations"]
    )


def test_ranks_with_other_layers_or_none_merge_into_the_union(ranks: list[dict[str, Any]]) -> None:
    first, second = _oracle(_batch()[:SPLIT]), _oracle(_batch()[SPLIT:])
    for got in ranks:
        assert got["other_layers"]["layers"] == ["0", "2"]
        _check(got["other_layers"]["activations"], "0", first["0"])  # only rank 0 watched "0"
        _check(got["other_layers"]["activations"], "2", second["2"])  # only rank 1 watched "2"
        assert got["other_layers_stats"]["paths"] == ["0", "2"]
        assert got["no_layers"]["layers"] == ["0", "1", "2"]  # rank 0's; rank 1 had none
        _check(got["no_layers"]["activations"], "0", first["0"])
        assert got["no_layers_stats"]["paths"] == ["0", "2"]
        counts = got["no_layers_stats"]["tensors"]["records"][..., RECORD.index("count")]
        assert counts.tolist() == [[SPLIT * 6, SPLIT * 2]] * 2
        assert got["never_recorded"]["layers"] == ["0", "1", "2"]
        _check(got["never_recorded"]["activations"], "2", first["2"])
        assert got["keys"] == ["a"]
    assert _same(ranks[0]["other_layers"], ranks[1]["other_layers"])


def test_max_norm_under_ddp_keeps_replicas_identical_and_a_rank0_only_constraint_is_found(
    ranks: list[dict[str, Any]],
) -> None:
    for rank, got in enumerate(ranks):
        everywhere, rank0_only = got["replicas_ok"], got["replicas_rank0_only"]
        assert everywhere["differ"] == [] and everywhere["corrections"] >= 2  # it did correct both layers
        assert bool((everywhere["max_norms"] <= 0.5 + 1e-6).all())
        assert rank0_only["differ"] == ["0.weight", "2.weight"]  # biases are not constrained
        assert bool((rank0_only["max_norms"] <= 0.5 + 1e-6).all()) == (rank == 0)


def test_grad_norms_after_all_reduce_equal_the_whole_batch_gradient(ranks: list[dict[str, Any]]) -> None:
    model = _model()
    (model(_batch()).pow(2).sum() / 2).backward()  # DDP averages the two ranks' gradients
    for got in ranks:
        assert list(got["grad_norms"]) == ["0.weight", "0.bias", "2.weight", "2.bias"]
        for name, param in model.named_parameters():
            assert torch.allclose(got["grad_norms"][name]["norm"], param.grad.double().norm(), rtol=1e-5)
            assert float(got["grad_norms"][name]["nonfinite"]) == 0.0


def test_stats_reducers_merge_across_ranks_also_when_one_saw_nothing(ranks: list[dict[str, Any]]) -> None:
    for got, rows in ((ranks[0]["reducer"], _batch()), (ranks[0]["reducer_alone"], _batch()[:SPLIT])):
        values = rows.double().reshape(-1)
        assert int(got["count"]) == values.numel() and int(got["nonfinite"]) == 0
        assert torch.allclose(got["mean"], values.mean()) and torch.allclose(got["var"], values.var(correction=1))
        assert float(got["min"]) == float(values.min()) and float(got["max"]) == float(values.max())
    for key in ("reducer", "reducer_alone"):
        assert all(torch.equal(ranks[0][key][name], ranks[1][key][name]) for name in ranks[0][key])


def test_a_rank_that_never_joins_fails_the_merge_after_the_timeout(ranks: list[dict[str, Any]]) -> None:
    assert ranks[1]["missing_rank"] == ""
    message = ranks[0]["missing_rank"]
    assert message.startswith("all_gather_object failed on rank 0: not every rank joined within 2 s, or a rank failed")
    assert "Every rank must call hookscope's merges" in message and "Timed out" in message
