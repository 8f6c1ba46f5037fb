"""One meaning for `merge` and `combine`: `merge_*` is a collective across ranks (every rank calls it, it returns
the merged object); `combine*` folds parts held in this process into a new object and leaves its inputs unchanged.

Each combine is checked against a naive float64 oracle of the pooled values (`tests/stats_oracle.py`)."""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import warnings

import torch
import torch.nn as nn

from hookscope.callbacks import ActivationStats, combine_activation_stats
from hookscope.distributed import MergeWarning, combine_ranks, merge_records, merge_stats_reducer
from hookscope.reducers import StatsReducer
from hookscope.results import combine_results
from hookscope.stats._describe import describe
from hookscope.stats._record import RECORD, STATISTICS, combine, finalize
from hookscope.stats._spec import Spec
from hookscope.watch import watch
from stats_oracle import expected, values_of

_PUBLIC_MODULES = (
    "hookscope", "hookscope.distributed", "hookscope.results", "hookscope.callbacks", "hookscope.stats._record",
    "hookscope.stats._norms",
)  # fmt: skip
"""The modules whose `merge*`/`combine*` functions follow the rule: the public ones, and the engine's own."""


def _values(seed: int, n: int, scale: float) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale + seed
    x[::7] = 0.0  # some values near zero
    return x.float()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))


def _assert_stats(got: dict[str, float], values: torch.Tensor, near_zero: float = 1e-3) -> None:
    want = expected(values_of(values), near_zero=near_zero)
    assert int(got["count"]) == want.count and int(got["nonfinite"]) == want.nonfinite
    for name in ("mean", "std", "min", "max", "near_zero"):
        assert math.isclose(got[name], getattr(want, name), rel_tol=1e-9, abs_tol=1e-9), name


def test_reducer_combine_returns_a_new_reducer_equal_to_the_oracle_and_leaves_inputs_alone() -> None:
    a, b = StatsReducer(), StatsReducer()
    xa, xb = _values(1, 300, 2.0), torch.cat([_values(2, 50, 5.0), torch.tensor([math.nan, math.inf])])
    a.push(xa)
    b.push(xb)
    before = [copy.deepcopy(r.state_dict()) for r in (a, b)]
    combined = a.combine(b)
    assert combined is not a and combined is not b and combined.pushes == 2
    for reducer, state in zip((a, b), before, strict=True):
        after = reducer.state_dict()
        assert after["pushes"] == state["pushes"] and _same(after["state"]["record"], state["state"]["record"])
    stats = combined.peek()
    assert stats is not None
    _assert_stats({k: float(v) for k, v in stats.as_dict().items()}, torch.cat([xa, xb]))


def test_reducer_merge_is_the_seeds_in_place_fold_without_a_warning() -> None:
    a, b = StatsReducer(), StatsReducer()
    a.push(_values(3, 40, 1.0))
    b.push(_values(4, 60, 3.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = a.merge(b)  # type: ignore[func-returns-value]
    assert result is None and a.pushes == 2  # the old behaviour: a holds both now
    stats = a.peek()
    assert stats is not None
    _assert_stats(
        {k: float(v) for k, v in stats.as_dict().items()}, torch.cat([_values(3, 40, 1.0), _values(4, 60, 3.0)])
    )


def test_merge_stats_reducer_outside_a_run_returns_a_new_equal_reducer() -> None:
    reducer = StatsReducer()
    reducer.push(_values(5, 30, 1.0))
    merged = merge_stats_reducer(reducer)
    assert merged is not reducer and reducer.pushes == 1
    got, want = merged.peek(), reducer.peek()
    assert got is not None and want is not None
    assert all(_same(got.as_dict()[k].cpu(), v.cpu()) for k, v in want.as_dict().items())


def test_engine_combines_leave_their_inputs_unchanged_and_match_the_oracle() -> None:
    spec = Spec()
    xs = [_values(6, 100, 1.0), _values(7, 17, 9.0)]
    records = [describe(x, spec).record for x in xs]
    copies = [r.clone() for r in records]
    pair = combine(records[0], records[1])
    stacked = torch.stack(records)
    ranks = combine_ranks(stacked)
    assert all(_same(r, c) for r, c in zip(records, copies, strict=True))
    assert _same(stacked, torch.stack(copies))
    for folded in (pair, ranks, merge_records(records[0].unsqueeze(0)).squeeze(0)):
        assert folded.shape[-1] == len(RECORD)
    for folded in (pair, ranks):
        got = dict(zip(STATISTICS, finalize(folded).tolist(), strict=True))
        _assert_stats(got, torch.cat(xs))


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU())


def test_combine_results_leaves_parts_unchanged_and_matches_the_oracle() -> None:
    data = [torch.randn(5, 4, generator=torch.Generator().manual_seed(s)) for s in (8, 9)]
    parts = []
    for x in data:
        model = _model()
        with watch(model) as w:
            model(x).sum().backward()
        parts.append(w.results())
    before = copy.deepcopy([p.activations for p in parts])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MergeWarning)
        combined = combine_results(parts)
    assert combined is not parts[0]
    for part, old in zip(parts, before, strict=True):
        assert all(_same(part.activations[p][s], old[p][s]) for p in old for s in old[p])
    out = torch.cat([_model()[0](x).detach() for x in data])  # oracle: layer 0's outputs on both parts
    got = {name: float(series[0]) for name, series in combined.activations["0"].items()}
    want = expected(values_of(out))
    assert int(got["count"]) == want.count
    for name in ("mean", "std", "min", "max"):
        assert math.isclose(got[name], getattr(want, name), rel_tol=1e-5, abs_tol=1e-6), name


def test_combine_activation_stats_leaves_parts_unchanged_and_matches_the_oracle() -> None:
    data = [torch.randn(5, 4, generator=torch.Generator().manual_seed(s)) * 3 for s in (10, 11)]
    parts = []
    for x in data:
        model, stats = _model(), ActivationStats(with_hist=False)
        stats.on_fit_start(model)
        stats.on_batch_start(0)
        model(x)
        stats.on_batch_end(0)
        stats.on_fit_end()
        parts.append(stats)
    before = [copy.deepcopy(p.state_dict()) for p in parts]
    combined = combine_activation_stats(parts)
    assert combined is not parts[0]
    for part, old in zip(parts, before, strict=True):
        now = part.state_dict()
        assert now["paths"] == old["paths"]
        assert all(_same(now["tensors"][k], v) for k, v in old["tensors"].items())
    out = torch.cat([_model()[0](x).detach() for x in data])
    want = expected(values_of(out), near_zero=0.05, signed=True)
    row = combined.stats[0][0]
    assert math.isclose(row["mean"], want.mean, rel_tol=1e-5) and math.isclose(row["std"], want.std, rel_tol=1e-5)
    assert math.isclose(row["near_zero"], want.near_zero, rel_tol=1e-6)


def _public_functions() -> dict[str, object]:
    found: dict[str, object] = {}
    for name in _PUBLIC_MODULES:
        module = importlib.import_module(name)
        for attribute in getattr(module, "__all__", []):
            value = getattr(module, attribute)
            if attribute.startswith(("merge", "combine")) and callable(value):
                found[f"{name}.{attribute}"] = value
    return found


def test_merge_names_are_collectives_and_combine_names_are_not() -> None:
    """A collective takes a `timeout` (every rank waits on the others); a local combine never does."""
    functions = _public_functions()
    assert {"hookscope.merge_results", "hookscope.combine_results", "hookscope.stats._record.combine"} <= set(functions)
    assert "hookscope.callbacks.merge_activation_stats" in functions
    for name, function in functions.items():
        takes_timeout = "timeout" in inspect.signature(function).parameters  # type: ignore[arg-type]
        assert takes_timeout == name.rsplit(".", 1)[1].startswith("merge_"), name
