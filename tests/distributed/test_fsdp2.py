"""FSDP2 (`fully_shard`, DTensor parameters) on 2 gloo CPU ranks (E4): merged statistics equal the single-process
reference, and gradient norms of sharded parameters combine as the root of the ranks' summed squares.

watch() records activations, output gradients and (per shard) parameter gradients of an FSDP2 model; the shard norms
are also taken with hookscope's post-accumulate-grad hooks, which FSDP2 calls on the sharded parameters after its
reduce-scatter, and both merge to the whole gradient's norm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn

from hookscope.callbacks import ActivationStats
from hookscope.callbacks._merge import merge_activation_stats
from hookscope.distributed import GRAD_SHARDED, grad_norms, is_sharded
from hookscope.hooks import register_post_accumulate_grad_hook
from hookscope.results import WatchResults, merge_results
from hookscope.watch import watch

from .launch import run_ranks

STEPS, ROWS, SPLIT, RANGE = 2, 12, 5, (-3.0, 3.0)
GROUPS = (
    "activations",
    "output_grads",
    "histograms",
    "unit_activity",
    "param_grads",
    "update_ratios",
    "identical_units",
)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def _batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randn(ROWS, 4, generator=generator) for _ in range(STEPS)]


def _train(model: nn.Module, rank: int, world: int, read: Callable[[nn.Module], dict[str, torch.Tensor]]) -> Any:
    """SGD steps on this rank's rows under watch() and ActivationStats; `read(model)` after each backward."""
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    reads, stats = [], ActivationStats(with_hist=True, hist_range=RANGE)
    with watch(model, opt, groups=GROUPS, hist_range=RANGE) as w, stats.attach(model, opt):
        for batch in _batches():
            rows = batch if world == 1 else (batch[:SPLIT] if rank == 0 else batch[SPLIT:])
            (model(rows).pow(2).sum() * world / ROWS).backward()  # FSDP averages: the whole batch's gradient
            reads.append(read(model))
            opt.step()
            opt.zero_grad()
    return w.results(), stats, {name: torch.stack([r[name] for r in reads]) for name in reads[0]}


def _body(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    model = _model()
    for layer in (model[0], model[2], model):
        fully_shard(layer)
    shard_sums: dict[str, list[torch.Tensor]] = {}
    for name, param in model.named_parameters():

        def hook(p: torch.Tensor, name: str = name) -> None:
            local = p.grad.to_local() if is_sharded(p.grad) else p.grad  # type: ignore[union-attr]
            shard_sums.setdefault(name, []).append(local.detach().double().square().sum())

        register_post_accumulate_grad_hook(param, hook)
    local, stats, full_norms = _train(model, rank, world, _full_norms)
    shards = WatchResults(
        steps=torch.arange(STEPS),
        param_grads={
            n: {"norm": torch.stack(v).sqrt().float(), "nonfinite": torch.zeros(STEPS)} for n, v in shard_sums.items()
        },
        meta={"grad_reduction": GRAD_SHARDED},
    )
    merged, merged_shards = merge_results(local), merge_results(shards)
    return {
        "label": local.meta["grad_reduction"],
        "sharded": [is_sharded(p) for p in model.parameters()],
        "layers": list(merged.layers),
        "activations": merged.activations,
        "output_grads": merged.output_grads,
        "histograms": merged.histograms,
        "param_grads": {name: stats["norm"] for name, stats in merged_shards.param_grads.items()},
        "watch_param_grads": {name: stats["norm"] for name, stats in merged.param_grads.items()},
        "own_shards": {name: torch.stack(v).sqrt() for name, v in shard_sums.items()},
        "grad_norms": full_norms,
        "stats": merge_activation_stats(stats).state_dict(),
    }


def _full_norms(model: nn.Module) -> dict[str, torch.Tensor]:
    norms = grad_norms(model)
    assert all(float(n["nonfinite"]) == 0.0 for n in norms.values())
    return {name: n["norm"] for name, n in norms.items()}


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_ranks(_body)


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """One process, whole batches; gradient norms read from `.grad` directly."""

    def read(model: nn.Module) -> dict[str, torch.Tensor]:
        return {name: p.grad.double().norm() for name, p in model.named_parameters() if p.grad is not None}

    results, stats, norms = _train(_model(), 0, 1, read)
    return {"results": results, "stats": stats, "grad_norms": norms}


def test_fsdp2_parameters_are_sharded_and_labelled(ranks: list[dict[str, Any]]) -> None:
    for got in ranks:
        assert got["label"] == GRAD_SHARDED
        assert all(got["sharded"])
        assert got["layers"] == ["0", "1", "2"]  # the same paths as the plain model


def test_fsdp2_merged_activations_output_grads_and_activation_stats_equal_one_process(
    ranks: list[dict[str, Any]], reference: dict[str, Any]
) -> None:
    want: WatchResults = reference["results"]
    for got in ranks:
        for group in ("activations", "output_grads"):
            for path, stats in getattr(want, group).items():
                for stat, values in stats.items():
                    mine = got[group][path][stat]
                    assert torch.allclose(mine, values, rtol=1e-5, atol=1e-6, equal_nan=True), (group, path, stat)
        for path, counts in want.histograms.items():
            assert torch.equal(got["histograms"][path], counts)
        stats, want_stats = ActivationStats(with_hist=True, hist_range=RANGE), reference["stats"]
        stats.load_state_dict(got["stats"])
        assert stats.paths == want_stats.paths == ["0", "2"]
        for j in range(2):
            assert all(
                torch.allclose(a, b, rtol=1e-5, atol=1e-6)
                for a, b in zip(stats.layer_stats(j), want_stats.layer_stats(j), strict=True)
            )
            assert torch.equal(stats.hist(j), want_stats.hist(j))


def test_fsdp2_gradient_norms_are_root_sums_of_squares_of_the_shards(
    ranks: list[dict[str, Any]], reference: dict[str, Any]
) -> None:
    want = reference["grad_norms"]
    for got in ranks:
        for name, norms in want.items():
            assert torch.allclose(got["param_grads"][name].double(), norms.double(), rtol=1e-5), name
            assert torch.allclose(got["watch_param_grads"][name].double(), norms.double(), rtol=1e-5), name
            assert torch.allclose(got["grad_norms"][name], norms, rtol=1e-5), name
    for name, norms in want.items():  # each rank alone holds a part of the gradient
        own = [got["own_shards"][name] for got in ranks]
        assert bool((own[0] < norms.double() - 1e-6).all()) or bool((own[1] < norms.double() - 1e-6).all())
        assert torch.allclose((own[0] ** 2 + own[1] ** 2).sqrt(), norms.double(), rtol=1e-5)
