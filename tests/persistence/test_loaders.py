"""Loaders that refuse garbage (issue 15): each case one that was accepted, or failed deep inside, before."""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save as st_save

from hookscope import MonitorPool, Watch, load_state, save_state, watch
from hookscope._io import SCHEMA_VERSION, atomic_write, load_bundle
from hookscope.monitors import OutputMonitor
from hookscope.reducers import HistogramReducer, ReservoirReducer, StatsReducer
from hookscope.report import write_report
from hookscope.results import WatchResults


def _results(steps: int = 3, layers: tuple[str, ...] = ("0", "2")) -> WatchResults:
    series = torch.arange(steps, dtype=torch.float32)
    results = WatchResults(steps=torch.arange(steps), layers={path: "Linear" for path in layers})
    for path in layers:
        results.activations[path] = {"mean": series.clone(), "std": series + 1}
        results.histograms[path] = torch.ones(steps, 4)
        results.hist_edges[path] = torch.linspace(-1, 1, 5)
    return results


def _write(path: Path, tensors: dict[str, torch.Tensor], document: dict[str, object]) -> Path:
    header = {"kind": "watch_results", "schema_version": SCHEMA_VERSION, "document": document}
    path.write_bytes(st_save(tensors, metadata={"hookscope": json.dumps(header)}))
    return path


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        model(torch.randn(8, 3)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


# ---- results files ---------------------------------------------------------------------------------------------
def test_an_unknown_document_key_is_a_value_error_naming_the_key_and_the_file(tmp_path: Path) -> None:
    tensors, document = load_bundle(_results().save(tmp_path / "r.safetensors"), "watch_results")
    bad = _write(tmp_path / "bad.safetensors", tensors, {**document, "surprise": 1})
    with pytest.raises(ValueError, match=r"bad.safetensors': field results has an unknown key 'surprise'; known keys"):
        WatchResults.load(bad)


def test_tensor_names_never_become_attributes(tmp_path: Path) -> None:
    tensors, document = load_bundle(_results().save(tmp_path / "r.safetensors"), "watch_results")
    for name in ("__dict__/summary", "summary", "meta/x", "activations"):
        bad = _write(tmp_path / "bad.safetensors", {**tensors, name: torch.zeros(3)}, document)
        with pytest.raises(ValueError, match=f"field tensor {name!r} is not a results tensor"):
            WatchResults.load(bad)
    assert callable(WatchResults.load(tmp_path / "r.safetensors").summary)


def test_a_series_longer_than_the_steps_is_refused(tmp_path: Path) -> None:
    results = _results()
    results.activations["0"]["mean"] = torch.arange(5.0)  # 5 values for 3 steps
    with pytest.raises(ValueError, match=r"activations\['0'\]\['mean'\] must have dim 0 of size 3 \(steps is 3"):
        results.save(tmp_path / "r.safetensors")  # never written: it could not be read back
    tensors, document = load_bundle(_results().save(tmp_path / "r.safetensors"), "watch_results")
    bad = _write(tmp_path / "bad.safetensors", {**tensors, "activations/0/mean": torch.arange(5.0)}, document)
    with pytest.raises(ValueError, match=r"bad.safetensors': field results.activations\['0'\]\['mean'\] must have"):
        WatchResults.load(bad)


def test_a_histogram_with_7_counts_and_5_edges_is_refused(tmp_path: Path) -> None:
    results = _results()
    results.histograms["0"] = torch.ones(3, 7)
    with pytest.raises(ValueError, match=r"histograms\['0'\] must have dim 1 of size 4 \(bins of '0' is 4, from"):
        results.save(tmp_path / "r.safetensors")


def test_results_load_from_a_report_folder_and_name_the_files_of_a_multi_model_folder(tmp_path: Path) -> None:
    write_report(tmp_path / "one", _results())
    assert WatchResults.load(tmp_path / "one").steps.tolist() == [0, 1, 2]
    for name, steps in (("1-MLP", 2), ("2-CNN", 4)):  # the layout hookscope run writes for two models
        (tmp_path / "run" / name).mkdir(parents=True)
        _results(steps).save(tmp_path / "run" / name / "results.safetensors")
    with pytest.raises(ValueError, match=r"holds the reports of 2 models: load one of '.*1-MLP/results.safetensors'"):
        WatchResults.load(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="path must be a results file or a report folder holding results"):
        WatchResults.load(tmp_path / "empty")


def test_a_fifo_is_refused_by_loaders_instead_of_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="which is a device, FIFO or socket"):
        WatchResults.load(fifo)
    with pytest.raises(ValueError, match="which is a device, FIFO or socket"):
        load_state(fifo)


# ---- save targets -------------------------------------------------------------------------------------------------
def _savers(target: Path) -> list[object]:
    reducer = StatsReducer()
    return [
        lambda: _results().save(target),
        lambda: save_state(target, {"a": 1}),
        lambda: reducer.save(target),
        lambda: atomic_write(target, "text"),
    ]


def test_saving_onto_a_fifo_or_a_folder_is_refused_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    fifo, folder = tmp_path / "pipe", tmp_path / "folder"
    os.mkfifo(fifo)
    folder.mkdir()
    for target, kind in ((fifo, "a device, FIFO or socket"), (folder, "a folder")):
        for save in _savers(target):
            with pytest.raises(ValueError, match=f"path must be a regular file to save to, got .*, which is {kind}"):
                save()  # type: ignore[operator]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and folder.is_dir() and not any(folder.iterdir())


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="making a device node needs root")
def test_saving_onto_a_device_node_is_refused(tmp_path: Path) -> None:
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own, in tmp
    for save in _savers(null):
        with pytest.raises(ValueError, match="which is a device, FIFO or socket"):
            save()  # type: ignore[operator]
    assert stat.S_ISCHR(os.stat(null).st_mode)


def test_lone_surrogates_in_names_are_saved_and_read_back(tmp_path: Path) -> None:
    name = "layer\ud800x"  # a name that was never valid Unicode (from a bytes path, a bad decode)
    results = _results(layers=(name,))
    loaded = WatchResults.load(results.save(tmp_path / "r.safetensors"))
    assert list(loaded.layers) == [name] and torch.equal(loaded.histograms[name], results.histograms[name])
    atomic_write(tmp_path / "page.html", f"<p>{name}</p>")
    assert (tmp_path / "page.html").read_text(encoding="utf-8") == "<p>layer\ufffdx</p>"


# ---- reducer, monitor and pool states --------------------------------------------------------------------------
def test_reducer_states_of_the_wrong_shape_are_refused_and_the_reducer_kept() -> None:
    reservoir = ReservoirReducer(4)
    reservoir.push(torch.arange(10.0))
    big = ReservoirReducer(100)
    big.push(torch.arange(200.0))
    state = big.state_dict()
    state["config"] = reservoir.config()
    with pytest.raises(ValueError, match=r"state.state.values must have dim 0 of size 4 \(capacity is 4"):
        reservoir.load_state_dict(state)  # 100 values at capacity 4
    assert reservoir.peek() is not None and reservoir.dump().shape == (4,)  # type: ignore[union-attr]
    histogram = HistogramReducer(6)
    state = histogram.state_dict()
    state["state"]["counts"] = torch.zeros(9, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"state.state.counts must have dim 0 of size 8 \(bins is 6"):
        histogram.load_state_dict(state)
    stats = StatsReducer()
    state = stats.state_dict()
    state["state"]["record"] = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"state.state.record must have dim 0 of size 9, got 3"):
        stats.load_state_dict(state)


def test_monitor_pool_load_is_all_or_nothing(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    pool = MonitorPool(OutputMonitor.partialconstructor(StatsReducer()), model)
    for _ in range(24):
        model(torch.randn(2, 3))
    state = pool.state_dict()
    state["monitors"]["0"]["counts"]["recorded"] = 12345  # a valid first monitor ...
    state["monitors"]["2"]["reducer"]["state"]["record"] = torch.zeros(2, dtype=torch.float64)  # ... a broken one
    with pytest.raises(ValueError, match=r"field state.monitors\['2'\].reducer.state.record must have dim 0 of size 9"):
        load_state(save_state(tmp_path / "pool.safetensors", state, kind="monitor_pool"), pool)
    assert pool["0"].counts["recorded"] == 24 and pool["2"].counts["recorded"] == 24
    model(torch.randn(2, 3))
    assert pool["0"].counts["recorded"] == 25 and int(pool["0"].peek().count) == 25 * 2 * 4


# ---- watch states --------------------------------------------------------------------------------------------------
def _watched(
    widths: tuple[int, ...] = (4, 2), prefix: str = "", steps: int = 3
) -> tuple[Watch, nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(3, widths[0])]
    for before, after in itertools.pairwise(widths):
        layers += [nn.ReLU(), nn.Linear(before, after)]
    model: nn.Module = nn.Sequential(*layers)
    if prefix:
        model = nn.Sequential(nn.Identity(), model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watcher = watch(model, optimizer)
    watcher.attach()
    _train(model, optimizer, steps)
    return watcher, model, optimizer


def test_a_state_from_another_model_leaves_the_watch_unchanged_and_training() -> None:
    mine, model, optimizer = _watched()
    theirs, *_ = _watched((4, 4, 2), prefix="wrapped", steps=5)
    before = mine.state_dict()
    with pytest.raises(ValueError, match=r"state must be saved from a watch of the same modules, got paths \['1.0'"):
        mine.load_state_dict(theirs.state_dict())
    assert mine.stepper.state.batches == before["batches"] == 3 and mine.stepper.state.recorded == before["recorded"]
    _train(model, optimizer, 3)  # used to fail: "Sizes of tensors must match"
    mine.detach()
    assert mine.results().steps.tolist() == list(range(6))


def test_a_state_whose_paths_match_but_widths_differ_is_refused() -> None:
    mine, model, optimizer = _watched((8, 2))
    theirs, *_ = _watched((16, 2))
    with pytest.raises(ValueError, match=r"same widths, got parameter '0.weight' of shape \(16, 3\) for one of"):
        mine.load_state_dict(theirs.state_dict())
    _train(model, optimizer, 2)
    mine.detach()
    assert mine.results().unit_activity["0"].shape == (8,)


def test_a_waiting_state_that_does_not_fit_the_modules_is_refused_at_attach() -> None:
    theirs, *_ = _watched(prefix="wrapped")
    fresh = Watch()
    fresh.load_state_dict(theirs.state_dict())  # no modules yet: checked when they are known
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="state must be saved from a watch of the same modules"):
        fresh.attach(model, optimizer)
    assert not fresh.is_attached and fresh.stepper.state.batches == 0
    with fresh.attach(model, optimizer):  # the refused state is gone: a fresh start
        _train(model, optimizer, 2)
    assert fresh.results().steps.tolist() == [0, 1]


def test_a_watch_state_with_nan_steps_or_other_bins_is_refused() -> None:
    mine, *_ = _watched()
    state = mine.state_dict()
    with pytest.raises(ValueError, match=r"field state.table.histograms must have dim 2 of size 10 \(bins is 8"):
        Watch(hist_bins=8).load_state_dict(state)
    state["first"] = {"forward": {"path": "0", "step": math.nan}, "backward": None}
    with pytest.raises(ValueError, match=r"field state.first.forward.step must be an int >= 0, got nan"):
        mine.load_state_dict(state)


# ---- the encoding of state files ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("state", "tensors", "field", "problem"),
    [
        ({"__tensor__": "t9"}, {}, "state", "must name a tensor of the file"),
        ({"__pickle__": "x"}, {}, "state", "must be encoded as one of"),
        ({"__dict__": [["a"]]}, {}, "state", r"must hold \[key, value\] pairs"),
        ({"__dict__": [[["a"], 1]]}, {}, r"state key \[.a.\]", "must be a str or number, once"),
        ({"__float__": "1e999"}, {}, "state", "must be 'nan', 'inf' or '-inf'"),
        ({"__tuple__": 3}, {}, "state", "must hold a list under __tuple__"),
        (1, {"t0": torch.zeros(1)}, "tensor 't0'", "is referenced nowhere in the state"),
    ],
)
def test_a_malformed_state_file_is_refused_naming_the_field(
    tmp_path: Path, state: object, tensors: dict[str, torch.Tensor], field: str, problem: str
) -> None:
    from hookscope._io import save_bundle

    path = save_bundle(tmp_path / "s.safetensors", tensors, {"state": state}, "state")
    with pytest.raises(ValueError, match=rf"s.safetensors': field {field} {problem}"):
        load_state(path)
