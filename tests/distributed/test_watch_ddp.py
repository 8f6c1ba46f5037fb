"""watch() and ActivationStats under DDP on 2 gloo ranks, merged, against one process on the whole batches.

One spawned run covers: attach after wrapping (watch + ActivationStats together), attach before wrapping (E1),
gradient accumulation with `no_sync` read with and without the optimizer (E5). Rank 0 takes 10 rows of each
batch of 16 and rank 1 takes 6, so averaging the ranks' means would be wrong; the loss is scaled so that DDP's
average of the ranks' gradients is the whole batch's gradient (the single-process trajectory).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from hookscope.callbacks import ActivationStats
from hookscope.callbacks._merge import merge_activation_stats
from hookscope.distributed import GRAD_AFTER_ALL_REDUCE, GRAD_LOCAL, is_main_process
from hookscope.results import WatchResults, combine_results, merge_results
from hookscope.watch import watch

from .launch import run_ranks

STEPS, ROWS, SPLIT, RANGE = 3, 16, 10, (-4.0, 4.0)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))


def _batches(count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(ROWS, 4, generator=generator) * 2 for _ in range(count)]


def _mine(batch: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    return batch if world == 1 else (batch[:SPLIT] if rank == 0 else batch[SPLIT:])


def _train(model: nn.Module, opt: torch.optim.Optimizer, rank: int, world: int, *watches: Any) -> None:
    """SGD steps on this rank's rows; loss scaled so DDP's average gradient is the whole batch's gradient."""
    for batch in _batches(STEPS):
        loss = model(_mine(batch, rank, world)).pow(2).sum() * world / ROWS
        for w in watches:
            w.log_loss(loss)
        loss.backward()
        opt.step()
        opt.zero_grad()


def _accumulate(model: nn.Module, opt: torch.optim.Optimizer, rank: int, world: int) -> None:
    """Two micro-batches per step, the first under `no_sync()` (E5)."""
    batches = _batches(2 * STEPS)
    for step in range(STEPS):
        for micro in range(2):
            rows = _mine(batches[2 * step + micro], rank, world)
            sync = getattr(model, "no_sync", None) if micro == 0 else None
            with sync() if sync is not None else contextlib.nullcontext():
                (model(rows).pow(2).sum() * world / (2 * ROWS)).backward()
        opt.step()
        opt.zero_grad()


def _watch_and_stats(model: nn.Module, ddp: nn.Module | None, rank: int, world: int) -> tuple[Any, Any]:
    """Train with watch + ActivationStats; `ddp=None`: attach to `model` then wrap it (E1)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = ActivationStats(with_hist=True, hist_range=RANGE)
    if ddp is None:
        w, driver = watch(model, opt, hist_range=RANGE), None
        w.attach()
        driver = stats.attach(model)
        target = DistributedDataParallel(model) if world > 1 else model
    else:
        target = ddp
        w = watch(target, opt, hist_range=RANGE)
        w.attach()
        driver = stats.attach(target)
    _train(target, opt, rank, world, w)
    w.detach()
    driver.detach()
    return w.results(), stats


def _body(rank: int, world: int, folder: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, before in (("after", False), ("before", True)):
        model = _model()
        local, stats = _watch_and_stats(model, None if before else DistributedDataParallel(model), rank, world)
        local.save(Path(folder) / f"{name}_local{rank}.hs")
        merged = merge_results(local)
        if is_main_process():
            merged.save(Path(folder) / f"{name}.hs")
        out[f"{name}_stats"] = merge_activation_stats(stats).state_dict()
    ddp = DistributedDataParallel(_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    with watch(ddp, opt, hist_range=RANGE) as after_step, watch(ddp, hist_range=RANGE) as after_backward:
        _accumulate(ddp, opt, rank, world)
    for name, w in (("accumulate", after_step), ("accumulate_local", after_backward)):
        merged = merge_results(w.results())
        if is_main_process():
            merged.save(Path(folder) / f"{name}.hs")
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("ddp")
    return folder, run_ranks(_body, str(folder))


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """One process, whole batches, same code."""
    model = _model()
    results, stats = _watch_and_stats(model, model, 0, 1)
    ddp_free = _model()
    opt = torch.optim.SGD(ddp_free.parameters(), lr=0.1)
    with watch(ddp_free, opt, hist_range=RANGE) as after_step, watch(ddp_free, hist_range=RANGE) as after_backward:
        _accumulate(ddp_free, opt, 0, 1)
    return {"train": results, "stats": stats, "accumulate": after_step.results(), "local": after_backward.results()}


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)


def _assert_same(got: WatchResults, want: WatchResults, groups: tuple[str, ...]) -> None:
    assert torch.equal(got.steps, want.steps) and list(got.layers) == list(want.layers)
    for group in groups:
        mine, theirs = getattr(got, group), getattr(want, group)
        assert list(mine) == list(theirs), group
        for name, stats in theirs.items():
            for stat, values in stats.items():
                assert _close(mine[name][stat], values), (group, name, stat, mine[name][stat], values)


def test_merged_watch_equals_one_process_on_the_whole_batch(ranks: Any, reference: dict[str, Any]) -> None:
    folder, _ = ranks
    merged, want = WatchResults.load(folder / "after.hs"), reference["train"]
    _assert_same(merged, want, ("activations", "output_grads", "param_grads"))
    assert merged.activations["0"]["count"].tolist() == [ROWS * 8.0] * STEPS
    for name, ratios in want.update_ratios.items():
        assert _close(merged.update_ratios[name], ratios)
    assert want.losses is not None and merged.losses is not None and _close(merged.losses, want.losses)
    assert merged.hist_edges.keys() == want.hist_edges.keys()
    for path, counts in want.histograms.items():
        assert torch.equal(merged.histograms[path], counts) and torch.equal(
            merged.hist_edges[path], want.hist_edges[path]
        )
    for path, activity in want.unit_activity.items():
        assert _close(merged.unit_activity[path], activity)
    assert merged.meta["grad_reduction"] == GRAD_AFTER_ALL_REDUCE
    assert merged.meta["distributed"]["world_size"] == 2 and "taken once" in merged.meta["distributed"]["param_grads"]
    assert merged.identical_units == want.identical_units and not merged.dropped


def test_combining_saved_rank_files_equals_the_collective_merge(ranks: Any) -> None:
    folder, _ = ranks
    parts = [WatchResults.load(folder / f"after_local{r}.hs") for r in range(2)]
    assert parts[0].activations["0"]["count"].tolist() == [SPLIT * 8.0] * STEPS  # the ranks saw unequal parts
    merged, collective = combine_results(parts), WatchResults.load(folder / "after.hs")
    for group in ("activations", "output_grads", "param_grads", "update_ratios", "histograms", "unit_activity"):
        torch.testing.assert_close(getattr(merged, group), getattr(collective, group), rtol=0, atol=0, equal_nan=True)


def test_attach_before_and_after_ddp_wrapping_gives_the_same_names_and_records(ranks: Any) -> None:
    folder, results = ranks
    after, before = WatchResults.load(folder / "after.hs"), WatchResults.load(folder / "before.hs")
    assert list(before.layers) == list(after.layers) == ["0", "1", "2", "3", "4"]
    assert (
        list(before.param_grads)
        == list(after.param_grads)
        == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    )
    _assert_same(before, after, ("activations", "output_grads", "param_grads"))
    assert before.meta["grad_reduction"] == GRAD_LOCAL  # attached before wrapping: the watch saw a plain model
    assert "taken once" in before.meta["distributed"]["param_grads"]  # ... and the merge found replicas
    for got in results:
        assert got["before_stats"]["paths"] == got["after_stats"]["paths"] == ["0", "2", "4"]


def test_merged_activation_stats_equal_one_process(ranks: Any, reference: dict[str, Any]) -> None:
    _, results = ranks
    want: ActivationStats = reference["stats"]
    for key in ("after_stats", "before_stats"):
        for got_state in (results[0][key], results[1][key]):
            got = ActivationStats(with_hist=True, hist_range=RANGE)
            got.load_state_dict(got_state)
            assert len(got.stats) == STEPS
            for j in range(len(want.paths)):
                assert all(_close(a, b) for a, b in zip(got.layer_stats(j), want.layer_stats(j), strict=True))
                assert torch.equal(got.hist(j), want.hist(j))


def test_no_sync_accumulation_is_labelled_and_post_reduction_values_match(
    ranks: Any, reference: dict[str, Any]
) -> None:
    folder, _ = ranks
    post, local = WatchResults.load(folder / "accumulate.hs"), WatchResults.load(folder / "accumulate_local.hs")
    _assert_same(post, reference["accumulate"], ("activations", "output_grads", "param_grads"))
    assert post.meta["grad_reduction"] == GRAD_AFTER_ALL_REDUCE
    assert local.meta["grad_reduction"] == GRAD_LOCAL
    _assert_same(local, reference["local"], ("activations", "output_grads"))
    assert local.num_steps == 2 * STEPS
    assert all(bool(s["norm"].isnan().all()) for s in local.param_grads.values())  # local gradients: not merged
    assert local.meta["distributed"]["param_grads_differ_at_steps"] == list(range(2 * STEPS))
    assert local.dropped["param_grads_not_reduced"] == 2 * STEPS * 6
    assert not math.isnan(float(reference["local"].param_grads["0.weight"]["norm"][0]))
