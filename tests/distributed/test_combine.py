"""Merging rules without a process group: results of model copies run on parts of the data, combined, against the
whole data in one watch (and against naive full-tensor oracles); labels, warnings and error messages."""

from __future__ import annotations

import copy
import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from hookscope.callbacks import ActivationStats
from hookscope.callbacks._merge import combine_activation_stats, merge_activation_stats
from hookscope.distributed import (
    GRAD_AFTER_ALL_REDUCE,
    GRAD_LOCAL,
    GRAD_SHARDED,
    MergeWarning,
    all_gather,
    all_reduce,
    check_replicas,
    gather_objects,
    grad_norms,
    grad_reduction,
    merge_stats_reducer,
)
from hookscope.reducers import StatsReducer
from hookscope.results import WatchResults, combine_results, merge_results
from hookscope.watch import watch


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3), nn.ReLU())


def _data() -> torch.Tensor:
    return torch.randn(20, 4, generator=torch.Generator().manual_seed(5)) * 2


def _run(batches: list[torch.Tensor], **options: object) -> WatchResults:
    model = _model()
    with watch(model, **options) as w:  # type: ignore[arg-type]
        for batch in batches:
            model(batch).pow(2).sum().backward()
    return w.results()


def _parts(**options: object) -> tuple[WatchResults, list[WatchResults]]:
    x = _data()
    whole = _run([x, x * 0.5], **options)
    return whole, [_run([x[:13], x[:13] * 0.5], **options), _run([x[13:], x[13:] * 0.5], **options)]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_parts_combine_to_the_whole_and_the_naive_oracle() -> None:
    whole, parts = _parts(hist_range=(-3.0, 3.0))
    with pytest.warns(MergeWarning, match="param_grads differ across ranks"):  # each copy has its own gradient
        merged = combine_results(parts, average_output_grads=False)
    for path, stats in whole.activations.items():
        assert all(_close(merged.activations[path][s], v) for s, v in stats.items()), path
        assert _close(merged.output_grads[path]["norm"], whole.output_grads[path]["norm"])
        assert torch.equal(merged.histograms[path], whole.histograms[path])
        assert _close(merged.unit_activity[path], whole.unit_activity[path])
    h = _model()[0](_data()).detach().double()  # oracle: layer 0 on the whole first batch
    got = merged.activations["0"]
    assert got["count"][0] == h.numel() and abs(float(got["mean"][0]) - float(h.mean())) < 1e-6
    assert (
        abs(float(got["std"][0]) - float(h.std())) < 1e-5
        and abs(float(got["rms"][0]) - float(h.square().mean().sqrt())) < 1e-5
    )
    assert float(got["min"][0]) == float(h.min()) and float(got["max"][0]) == float(h.max())
    assert abs(float(got["near_zero"][0]) - float((h.abs() <= 1e-3).double().mean())) < 1e-7
    with pytest.warns(MergeWarning):
        averaged = combine_results(parts)  # default: divided by the world size (the mean of the ranks' losses)
    assert _close(averaged.output_grads["0"]["norm"] * 2, merged.output_grads["0"]["norm"])
    assert merged.meta["distributed"]["world_size"] == 2
    assert merged.meta["distributed"]["histograms"] == "re-binned exactly to the widest range of any rank and summed"


def test_merged_means_are_not_averages_of_the_parts_means() -> None:
    _, parts = _parts()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MergeWarning)
        merged = combine_results(parts)
    means = [p.activations["0"]["mean"][0] for p in parts]
    naive = (means[0] + means[1]) / 2
    weighted = (means[0] * 13 + means[1] * 7) / 20
    assert abs(float(merged.activations["0"]["mean"][0]) - float(weighted)) < 1e-6
    assert abs(float(merged.activations["0"]["mean"][0]) - float(naive)) > 1e-3


def test_histograms_of_different_ranges_merge_exactly_into_the_whole() -> None:
    """Ranges that follow the data differ per rank; re-binned to the widest, they sum to the one process's."""
    x = _data()
    whole = _run([x, x * 3], groups=("activations", "histograms"))
    groups = ("activations", "histograms")
    parts = [_run([x[:13], x[:13] * 3], groups=groups), _run([x[13:], x[13:] * 3], groups=groups)]
    small = _run([x[13:] * 0.01, x[13:] * 0.01], groups=groups)
    assert not torch.equal(parts[0].hist_edges["0"], small.hist_edges["0"])  # the ranges differ ...
    with warnings.catch_warnings():
        warnings.simplefilter("error", MergeWarning)  # ... and nothing is approximate
        merged = combine_results(parts)
        combine_results([parts[0], small])
    for path in whole.histograms:
        assert torch.equal(merged.hist_edges[path], whole.hist_edges[path])
        assert torch.equal(merged.histograms[path], whole.histograms[path])


def test_different_fixed_histogram_ranges_are_refused() -> None:
    x = _data()
    parts = [_run([x], hist_range=(-3.0, 3.0)), _run([x], hist_range=(-1.0, 1.0))]
    with pytest.raises(ValueError, match=r"hist_range must be the same on every rank, got \[\[-3.0, 3.0\], \[-1.0"):
        combine_results(parts)


def _grads(label: str, norms: list[float], ratios: list[float] | None = None) -> WatchResults:
    steps = len(norms)
    return WatchResults(
        steps=torch.arange(steps),
        param_grads={"w": {"norm": torch.tensor(norms), "nonfinite": torch.zeros(steps)}},
        update_ratios={"w": torch.tensor(ratios if ratios is not None else [0.1] * steps)},
        meta={"grad_reduction": label},
    )


def test_parameter_gradients_taken_once_where_ranks_agree_and_nan_where_they_do_not() -> None:
    parts = [_grads(GRAD_AFTER_ALL_REDUCE, [1.0, 2.0, 3.0]), _grads(GRAD_AFTER_ALL_REDUCE, [1.0, 5.0, 3.0])]
    with pytest.warns(MergeWarning, match=r"param_grads differ across ranks at 1 step\(s\) \(first \[1\]\)"):
        merged = combine_results(parts)
    norms = merged.param_grads["w"]["norm"]
    assert norms[0] == 1.0 and math.isnan(float(norms[1])) and norms[2] == 3.0
    assert merged.dropped == {"param_grads_not_reduced": 1}
    assert merged.meta["distributed"]["param_grads_differ_at_steps"] == [1]
    assert torch.equal(merged.update_ratios["w"], torch.full((3,), 0.1))


def test_sharded_parameter_gradients_combine_as_root_sum_of_squares() -> None:
    merged = combine_results([_grads(GRAD_SHARDED, [3.0, 1.0]), _grads(GRAD_SHARDED, [4.0, 1.0])])
    assert torch.allclose(merged.param_grads["w"]["norm"], torch.tensor([5.0, math.sqrt(2.0)], dtype=torch.float64))
    assert bool(merged.update_ratios["w"].isnan().all()) and merged.dropped == {"update_ratios_sharded": 2}


def test_nonfinite_values_on_one_rank_stay_in_their_layer() -> None:
    x = _data()
    model = _model()
    bad = nn.Sequential(copy.deepcopy(model[0]), nn.Tanh(), copy.deepcopy(model[2]), nn.ReLU())
    with torch.no_grad():
        bad[2].bias[0] = math.nan  # layer 2 gives NaN on this rank; layer 0 stays finite
    parts = []
    for net, rows in ((model, x[:10]), (bad, x[10:])):
        with watch(net, select=["0", "2"]) as w:
            net(rows).sum().backward()
        parts.append(w.results())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MergeWarning)
        merged = combine_results(parts)
    assert merged.activations["2"]["nonfinite"][0] == 10  # counted apart: the other values still describe the layer
    outputs = torch.cat([model[2](torch.tanh(model[0](x[:10]))), bad[2](torch.tanh(bad[0](x[10:])))]).detach()
    finite = outputs[torch.isfinite(outputs)].double()
    assert _close(merged.activations["2"]["mean"][0], finite.mean()) and _close(
        merged.activations["2"]["std"][0], finite.std()
    )
    assert _close(merged.activations["0"]["mean"], model[0](x).detach().double().mean().reshape(1))
    assert merged.first_nonfinite["forward"] == {"path": "2", "step": 0}


def test_merged_results_save_and_load(tmp_path: Path) -> None:
    _, parts = _parts(hist_range=(-3.0, 3.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MergeWarning)
        merged = combine_results(parts)
    loaded = WatchResults.load(merged.save(tmp_path / "merged.hs"))
    assert loaded.meta["distributed"] == merged.meta["distributed"]
    assert torch.equal(loaded.activations["2"]["std"], merged.activations["2"]["std"])


def _stats(batches: list[torch.Tensor], **options: object) -> ActivationStats:
    model, stats = _model(), ActivationStats(with_hist=True, **options)  # type: ignore[arg-type]
    with stats.attach(model):
        for batch in batches:
            model(batch).sum().backward()
    return stats


def test_activation_stats_parts_combine_to_the_whole() -> None:
    x = _data()
    whole = _stats([x, x * 3], hist_range=(-4.0, 4.0))
    merged = combine_activation_stats(
        [_stats([x[:6], x[:6] * 3], hist_range=(-4.0, 4.0)), _stats([x[6:]], hist_range=(-4.0, 4.0))]
    )
    assert merged.paths == whole.paths == ["0", "2"] and len(merged.stats) == 2
    for j in range(2):
        means, stds, near = merged.layer_stats(j)
        assert _close(means[0], whole.layer_stats(j)[0][0]) and _close(stds[0], whole.layer_stats(j)[1][0])
        assert _close(near[0], whole.layer_stats(j)[2][0])
        assert torch.equal(merged.hist(j)[:, 0], whole.hist(j)[:, 0])
    h = _model()[0](x * 3)[:6].detach()  # record 1 holds the first part only
    assert abs(float(merged.layer_stats(0)[0][1]) - float(h.mean())) < 1e-6


def test_merge_activation_stats_outside_a_process_group_is_a_copy() -> None:
    stats = _stats([_data(), _data() * 2], hist_range=(-4.0, 4.0))
    alone = merge_activation_stats(stats)
    assert alone is not stats and alone.paths == stats.paths and alone.dropped == stats.dropped
    for j in range(2):
        assert all(_close(a, b) for a, b in zip(alone.layer_stats(j), stats.layer_stats(j), strict=True))
        assert torch.equal(alone.hist(j), stats.hist(j)) and torch.allclose(alone.hist_edges(j), stats.hist_edges(j))


def test_activation_stats_with_different_ranges_merge_exactly() -> None:
    x = _data()
    whole = _stats([torch.cat([x[:6], x[6:] * 4])])
    with warnings.catch_warnings():
        warnings.simplefilter("error", MergeWarning)
        merged = combine_activation_stats([_stats([x[:6]]), _stats([x[6:] * 4])])
    for j in range(2):
        assert torch.equal(merged.hist_edges(j), whole.hist_edges(j))
        assert torch.equal(merged.hist_counts(j), whole.hist_counts(j))


def test_merge_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match=r"parts must be a non-empty list of WatchResults, got \[\]"):
        combine_results([])
    with pytest.raises(TypeError, match=r"parts must be a list of WatchResults, got \[\{\}\]"):
        combine_results([{}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"results must be a WatchResults, got 1; use the results of watch"):
        merge_results(1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"parts must be a non-empty list of ActivationStats, got \[\]"):
        combine_activation_stats([])
    with pytest.raises(TypeError, match=r"parts must be a list of ActivationStats, got \[WatchResults\("):
        combine_activation_stats([WatchResults()])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="stats must be an ActivationStats, got 1"):
        merge_activation_stats(1)  # type: ignore[arg-type]
    x = _data()
    with pytest.raises(ValueError, match=r"near_zero must be the same on every rank, got \[0.05, 0.1\]"):
        combine_activation_stats([_stats([x]), _stats([x], near_zero=0.1)])
    with pytest.raises(ValueError, match="op must be one of 'sum', 'min', 'max', got 'mean'"):
        all_reduce(torch.ones(2), "mean")
    with pytest.raises(TypeError, match="reducer must be a StatsReducer, got .*ActivationStats object"):
        merge_stats_reducer(ActivationStats())  # type: ignore[arg-type]


def test_outside_a_process_group_collectives_return_this_process_alone() -> None:
    results = _run([_data()])
    alone = merge_results(results)
    assert torch.equal(alone.activations["0"]["mean"], results.activations["0"]["mean"])
    assert alone.meta["distributed"]["world_size"] == 1
    assert gather_objects({"a": 1}) == [{"a": 1}] and torch.equal(all_gather(torch.ones(2))[0], torch.ones(2))
    model = _model()
    model(_data()).sum().backward()
    assert check_replicas(model) == []
    norms = grad_norms(model)
    assert list(norms) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert torch.allclose(norms["0.weight"]["norm"], model[0].weight.grad.double().norm())
    assert float(norms["0.weight"]["nonfinite"]) == 0.0
    assert grad_reduction(model) == grad_reduction(model, torch.optim.SGD(model.parameters())) == GRAD_LOCAL
    reducer = StatsReducer(near_zero=0.5)
    reducer.push(_data())
    alone = merge_stats_reducer(reducer)
    assert alone is not reducer and alone.config() == {"near_zero": 0.5}
    mine, theirs = alone.peek().as_dict(), reducer.peek().as_dict()  # type: ignore[union-attr]
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
