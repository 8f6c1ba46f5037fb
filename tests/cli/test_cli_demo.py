"""`hookscope demo`: trains, prints the summary, accuracy and diagnosis, writes the report; faults are found."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hookscope.demo._data import load_digits_split
from hookscope.demo._model import FAULTS
from hookscope.demo._train import DemoConfig, train_demo
from hookscope.doctor import diagnose
from hookscope.results import WatchResults


def test_demo_trains_prints_and_writes_the_report(tmp_path: Path, hookscope: Callable[..., object]) -> None:
    done = hookscope("demo", "--epochs", "1", "--out", str(tmp_path / "report"))
    assert done.code == 0, done.err
    assert "Total params: 38,410" in done.out  # 160 + 4640 + 32832 + 128 (the hidden layer's norm) + 650, by hand
    accuracy = float(re.search(r"held-out accuracy: ([\d.]+)%", done.out).group(1))
    assert accuracy > 60.0
    assert "hookscope doctor:" in done.out and "features.conv1" in done.out
    document = json.loads((tmp_path / "report" / "report.json").read_text())
    assert document["meta"]["accuracy"] == pytest.approx(accuracy / 100, abs=5e-4)
    assert document["summary"]["totals"]["total_params"] == 38_410
    results = WatchResults.load(tmp_path / "report" / "results.safetensors")
    assert results.num_steps == 45 and results.losses is not None  # ceil(1438 / 32) batches in one epoch
    assert document["findings"] == []  # the healthy demo: no warning
    activity = results.unit_activity["classifier.act3"]  # share of (image, step) where each hidden unit was > 0
    assert int((activity < 0.01).sum()) == 0  # without the norm: 24-32 of 64 below 1% after one epoch (seeds 0-2)
    assert (tmp_path / "report" / "report.html").stat().st_size > 10_000


def test_digits_split_is_the_bundled_data_shuffled_once() -> None:
    from sklearn.datasets import load_digits

    x_train, y_train, x_test, y_test = load_digits_split(seed=0)
    assert x_train.shape == (1438, 1, 8, 8) and x_test.shape == (359, 1, 8, 8)
    assert sorted(y_train.tolist() + y_test.tolist()) == sorted(load_digits().target.tolist())
    assert float(x_train.max()) == 1.0 and float(x_train.min()) == 0.0
    with pytest.raises(ValueError, match=r"test_fraction must be in \(0, 1\), got 1.5"):
        load_digits_split(test_fraction=1.5)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_is_found_by_its_check(fault: str) -> None:
    run = train_demo(DemoConfig(epochs=1, fault=fault))
    found = [finding for finding in diagnose(run.results) if finding.check == FAULTS[fault].expected_check]
    assert found
    if fault == "nan":  # the first producer is named, not a later layer
        assert (found[0].path, found[0].step) == ("features.act2", 0)
    if fault == "dead-relu":
        assert found[0].path == "classifier.act3" and found[0].evidence["dead"] >= 48  # 48 of 64 planted


def test_demo_help_lists_the_faults(hookscope: Callable[..., object]) -> None:
    done = hookscope("demo", "--help")
    assert done.code == 0
    for name, fault in FAULTS.items():
        assert re.search(rf"^\s+{re.escape(name)}\s+{re.escape(fault.description)}$", done.out, flags=re.M)


def test_demo_argument_errors(tmp_path: Path, hookscope: Callable[..., object]) -> None:
    done = hookscope("demo", "--fault", "melted")
    assert done.code == 2 and "argument --fault: invalid choice: 'melted'" in done.err
    done = hookscope("demo", "--epochs", "0")
    assert done.code == 2 and "argument --epochs: must be a positive int, got '0'" in done.err
    (tmp_path / "file").write_text("x")
    done = hookscope("demo", "--out", str(tmp_path / "file"))
    assert done.code == 2
    assert done.err.strip().splitlines() == [
        f"hookscope: error: --out must be a folder, got the file {str(tmp_path / 'file')!r} (--verbose shows the "
        "traceback)"
    ]
    with pytest.raises(ValueError, match=r"epochs must be a positive int, got 0"):
        DemoConfig(epochs=0)
