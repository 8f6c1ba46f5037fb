"""A missing optional extra: the data is saved first, then one line names the extra to install (exit 3).

A module is made missing in this process the way Python itself marks one as unimportable (`sys.modules[name] =
None`); tests/package/test_base_install.py runs the same commands in a virtualenv that never had the extras.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from hookscope import watch
from hookscope.cli._errors import EXIT_MISSING_EXTRA, MissingExtraError, extra_of_module, missing_of, require_extra
from hookscope.report import render_report, save_report_data, write_report
from hookscope.report._data import RESULTS_FILE
from hookscope.report._write import REPORT_FILE
from hookscope.results import WatchResults


def without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make `modules` unimportable here (and their submodules already imported)."""
    for name in list(sys.modules):
        if name.partition(".")[0] in modules:
            monkeypatch.delitem(sys.modules, name)
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_each_module_maps_to_the_smallest_extra_that_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert extra_of_module("matplotlib.figure") == "plot"
    assert extra_of_module("sklearn.datasets") == "cli" and extra_of_module("rich") == "cli"
    assert extra_of_module("lightning") is None and extra_of_module(None) is None
    without(monkeypatch, "sklearn", "matplotlib")
    assert missing_of("cli") == ["scikit-learn", "matplotlib"] and missing_of("plot") == ["matplotlib"]
    with pytest.raises(
        MissingExtraError, match=r"^x needs matplotlib, not installed: pip install 'hookscope\[plot\]'$"
    ):
        require_extra("plot", "x")


def test_run_saves_the_data_before_it_draws(
    tmp_path: Path,
    hookscope: Callable[..., object],
    training_script: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = training_script(steps=5)
    without(monkeypatch, "matplotlib")
    done = hookscope("run", "--select", "0", "--out", str(tmp_path / "out"), str(script))  # one layer to draw
    assert done.code == EXIT_MISSING_EXTRA
    assert done.err.splitlines()[-1] == (
        f"hookscope: error: the data is saved in {tmp_path / 'out'}, but drawing report.html needs matplotlib, not "
        f"installed: pip install 'hookscope[plot]', then hookscope report {tmp_path / 'out'}"
    )
    assert WatchResults.load(tmp_path / "out" / RESULTS_FILE).num_steps == 5  # watched from the first step
    assert not (tmp_path / "out" / REPORT_FILE).exists()
    refused = hookscope("report", str(tmp_path / "out"))
    assert (refused.code, refused.err) == (
        EXIT_MISSING_EXTRA,
        "hookscope: error: hookscope report needs matplotlib, not installed: pip install 'hookscope[plot]'\n",
    )
    monkeypatch.undo()  # matplotlib installed again: the page is drawn from what was saved
    drawn = hookscope("report", str(tmp_path / "out"))
    assert drawn.code == 0 and (tmp_path / "out" / REPORT_FILE).stat().st_size > 1000


def test_demo_is_refused_before_training(
    tmp_path: Path, hookscope: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    without(monkeypatch, "rich")
    done = hookscope("demo", "--out", str(tmp_path / "demo"))
    assert (done.code, done.out) == (EXIT_MISSING_EXTRA, "")
    assert done.err == "hookscope: error: hookscope demo needs rich, not installed: pip install 'hookscope[cli]'\n"
    assert not (tmp_path / "demo").exists()


def watched_results() -> WatchResults:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, select="0") as w:  # one layer: few figures to draw
        for _ in range(3):
            loss = model(torch.randn(8, 3)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.log_loss(loss)
    return w.results()


def test_saved_data_draws_the_page_write_report_draws(tmp_path: Path) -> None:
    results, meta = watched_results(), {"created": "2026-01-01 00:00:00 UTC", "script": "train.py"}
    folder = save_report_data(tmp_path / "saved", results, findings=[], meta=meta)
    assert folder == tmp_path / "saved" and not (folder / REPORT_FILE).exists()
    page = render_report(folder).read_text()
    assert "<img" in page and page == write_report(tmp_path / "direct", results, findings=[], meta=meta).read_text()
