"""A real notebook, executed by nbclient on a real ipykernel: a model's summary, a watched training, its results,
the doctor's findings and a plot show as HTML (and one PNG), with the numbers the report shows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from hookscope._html import cell
from hookscope.results import WatchResults
from hookscope.results._results import layer_figures

CELLS = [
    # 0: a model with a dead layer (every pre-activation of `hidden` is below 0: the doctor finds dead units)
    """import collections, torch, torch.nn as nn
import hookscope
from hookscope.doctor import diagnose
from hookscope.plot import plot_loss
torch.manual_seed(0)
model = nn.Sequential(collections.OrderedDict(
    encoder=nn.Linear(4, 16), hidden=nn.ReLU(), head=nn.Linear(16, 1)))
with torch.no_grad():
    model.encoder.bias.fill_(-20.0)""",
    "hookscope.summary(model, input_size=(8, 4))",
    """opt = torch.optim.SGD(model.parameters(), lr=0.05)
with hookscope.watch(model, opt) as w:
    for _ in range(6):
        loss = (model(torch.randn(8, 4)) - 1).pow(2).mean()
        w.log_loss(loss); loss.backward(); opt.step(); opt.zero_grad()
results = w.results()
results""",
    "findings = diagnose(results)\nfindings",
    "plot_loss(results)",
    "from hookscope.report import write_report\nwrite_report('report', results, findings=findings).name",
]


def outputs(notebook: Any, index: int, kind: str | None = None) -> list[Any]:
    found = notebook.cells[index].outputs
    return [o for o in found if kind is None or kind in o.get("data", {})]


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    folder = tmp_path_factory.mktemp("notebook")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in CELLS])
    client = NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(folder)}})
    client.execute()
    return notebook, folder


@pytest.mark.slow  # about 10 s: a kernel starts and imports torch
def test_the_notebook_runs_without_errors_and_shows_html(executed: tuple[Any, Path]) -> None:
    notebook, _ = executed
    errors = [o for c in notebook.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    summary = outputs(notebook, 1, "text/html")[0]["data"]["text/html"]
    assert all(f">{name}<" in summary or f"{name}</td>" in summary for name in ("encoder", "hidden", "head"))
    assert "Total params: 97" in summary  # 4*16+16 + 16+1
    assert outputs(notebook, 1)[0]["data"]["text/plain"].startswith("ModelSummary(Sequential: 4 modules, 97 params")
    table = outputs(notebook, 2, "text/html")[0]["data"]["text/html"]
    assert "<table" in table and table.count("<svg") >= 3 * 3 + 1  # 3 charts per layer, and the loss
    assert all(f"<td>{name}</td>" in re.sub(r"<td [^>]*>", "<td>", table) for name in ("encoder", "hidden", "head"))


@pytest.mark.slow
def test_findings_show_coloured_by_severity(executed: tuple[Any, Path]) -> None:
    notebook, _ = executed
    (shown,) = outputs(notebook, 3, "text/html")
    html = shown["data"]["text/html"]
    assert "dead_units" in html and "layer hidden" in html and "#d9534f" in html  # an error, in red
    assert shown["data"]["text/plain"].startswith("[Finding(")  # a list still


@pytest.mark.slow
def test_a_plot_shows_once_as_a_png(executed: tuple[Any, Path]) -> None:
    notebook, _ = executed
    shown = outputs(notebook, 4)
    assert len(shown) == 1 and "image/png" in shown[0]["data"], shown  # once: not again at the end of the cell


@pytest.mark.slow
def test_the_notebook_and_the_report_show_the_same_numbers(executed: tuple[Any, Path]) -> None:
    notebook, folder = executed
    table = re.sub(r"<td [^>]*>", "<td>", outputs(notebook, 2, "text/html")[0]["data"]["text/html"])
    saved = WatchResults.load(folder / "report")  # the results the report's page is drawn from
    for path in saved.layers:
        figures = "".join(f"<td>{cell(value)}</td>" for value in layer_figures(saved, path))
        assert f"<td>{path}</td><td>{saved.layers[path]}</td>{figures}" in table, path
    page = (folder / "report" / "report.html").read_text()
    findings = outputs(notebook, 3, "text/html")[0]["data"]["text/html"]
    message = re.search(r"<div>([^<]*units[^<]*)</div>", findings)
    assert message is not None and message.group(1) in page
