"""WandbSink and MLflowSink: a short watched training logged for real (W&B offline, an MLflow file store), read back
from disk and compared with the WatchResults the watch returned and with the losses the loop computed."""

from __future__ import annotations

import builtins
import importlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import wandb
from tracker_runs import offline_run, train_watched

from hookscope.doctor import Finding, Findings
from hookscope.report import write_report
from hookscope.results import WatchResults
from hookscope.watch import MLflowSink, WandbSink
from hookscope.watch._trackers import KeyNames, step_rows, tracker_key

FINDINGS = Findings(
    [
        Finding("dead_units", "error", "1", 2, "3 of 8 units never active", {"fraction": 0.375}, "Lower the lr."),
        Finding("lr_too_high", "warning", None, None, "updates <b>large</b>", {}, ""),
    ]
)


def expected_values(results: WatchResults) -> dict[tuple[str, int], float]:
    """`{(logged name, step): value}` for every recorded value, read straight from the results' series."""
    out = {}
    steps = results.steps.tolist()
    for group, names in results.series().items():
        for name, stats in names.items():
            for stat, values in stats.items():
                for step, value in zip(steps, values.tolist(), strict=True):
                    if not math.isnan(value):
                        out[(tracker_key(group, name, stat), step)] = value
    return out


def rebinned(counts: list[float], edges: list[float], results: WatchResults) -> list[float]:
    """`counts` on `edges` added into the bins of layer 0's final edges (each old bin lies inside one new bin)."""
    final = results.hist_edges["0"]
    centres = (torch.tensor(edges[:-1]) + torch.tensor(edges[1:])) / 2
    index = torch.bucketize(centres.to(final.dtype), final) - 1
    out = torch.zeros(len(final) - 1, dtype=torch.float64)
    out.index_add_(0, index, torch.tensor(counts, dtype=torch.float64))
    return out.tolist()


# ---- W&B --------------------------------------------------------------------------------------------------------
@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    wandb.teardown()  # settings another test's run left in this process (the environment is read at setup)
    return tmp_path


@pytest.mark.slow  # about 3 s: the wandb service starts
def test_wandb_offline_run_holds_what_the_watch_recorded(wandb_offline: Path) -> None:
    sink = WandbSink(project="hookscope-test", mode="offline", dir=str(wandb_offline))
    results, losses = train_watched([sink])
    report = write_report(wandb_offline / "report", results, findings=FINDINGS).parent
    sink.log_findings(FINDINGS)
    sink.log_report(report)
    sink.finish()
    wandb.teardown()  # the W&B service writes the run file behind finish(): wait for it
    run = offline_run(wandb_offline)

    expected = expected_values(results)
    rows = [row for row in run.history if "hookscope/step" in row]  # the findings table is a row of its own
    logged = {(key, row["hookscope/step"]): value for row in rows for key, value in row.items()}
    assert {key for key, _ in expected} >= {"gradients/0.weight/norm", "activations/1/mean", "hookscope/loss"}
    assert {"parameters/0.weight/update_ratio", "output_gradients/2/norm"} <= {key for key, _ in expected}
    for key, value in expected.items():
        assert logged[key] == pytest.approx(value, rel=1e-12), key
    assert [logged[("hookscope/loss", step)] for step in range(5)] == pytest.approx(losses, rel=1e-6)
    last = results.num_steps - 1
    assert run.summary["activations/0/std"] == pytest.approx(float(results.activations["0"]["std"][last]))
    assert run.summary["hookscope/step"] == 4
    assert run.metrics["activations/*"] == "hookscope/step" and run.metrics["hookscope/loss"] == "hookscope/step"

    step_3 = next(row for row in rows if row["hookscope/step"] == 3)  # a histogram is stored as its parts
    assert step_3["activations/0/histogram/_type"] == "histogram"
    assert sum(step_3["activations/0/histogram/values"]) == float(results.activations["0"]["count"][3])
    # Logged at a flush, on the range the layer had then: the results re-bin it exactly onto their wider range.
    assert rebinned(step_3["activations/0/histogram/values"], step_3["activations/0/histogram/bins"], results) == (
        results.histograms["0"][3].tolist()
    )

    table_row = next(row for row in run.history if "hookscope/findings/path" in row)
    assert table_row["hookscope/findings/_type"] == "table-file"
    table = json.loads((run.files / table_row["hookscope/findings/path"]).read_text())
    assert table["columns"] == ["severity", "check", "layer", "step", "message", "advice", "evidence"]
    assert table["data"][0][:4] == ["error", "dead_units", "1", 2] and table["data"][1][2] == "(model)"
    (artifact,) = [a for a in run.artifacts if a["type"] == "hookscope-report"]
    assert {"report.html", "results.safetensors", "report.json"} <= set(artifact["paths"])


def test_wandb_sink_logs_into_a_run_it_is_given_and_leaves_it_open() -> None:
    class Run:  # the part of a wandb run the sink uses: an object standing in for the W&B service
        def __init__(self) -> None:
            self.rows: list[dict[str, Any]] = []
            self.defined: list[tuple[str, str | None]] = []
            self.finished = False

        def log(self, row: dict[str, Any]) -> None:
            self.rows.append(row)

        def define_metric(self, name: str, step_metric: str | None = None) -> None:
            self.defined.append((name, step_metric))

        def finish(self) -> None:
            self.finished = True

    run = Run()
    sink = WandbSink(run, histograms=False)
    results, _ = train_watched([sink], steps=3)
    sink.finish()
    assert not run.finished and [row["hookscope/step"] for row in run.rows] == [0, 1, 2]
    assert all("activations/0/histogram" not in row for row in run.rows)
    assert run.rows[1]["activations/2/max"] == float(results.activations["2"]["max"][1])
    assert ("gradients/*", "hookscope/step") in run.defined


def test_wandb_sink_refuses_bad_arguments(wandb_offline: Path) -> None:
    with pytest.raises(TypeError, match=r"run must be a wandb run \(wandb.init\(\)\) or None, got str"):
        WandbSink("my-run")
    run = type("Run", (), {"log": print, "define_metric": print})()
    with pytest.raises(ValueError, match=r"run and wandb.init keywords cannot both be given, got run and \['proj"):
        WandbSink(run, project="p")
    with pytest.raises(ValueError, match="folder must be the folder a report was written to, got '.*nowhere'"):
        WandbSink(mode="disabled").log_report(wandb_offline / "nowhere")


# ---- MLflow -----------------------------------------------------------------------------------------------------
@pytest.mark.slow  # about 4 s: mlflow imports
def test_mlflow_file_store_holds_what_the_watch_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this switch
    from mlflow import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    sink = MLflowSink(tracking_uri=uri, experiment="hookscope-test", run_name="watched")
    results, losses = train_watched([sink])
    page = write_report(tmp_path / "report", results, findings=FINDINGS)
    sink.log_findings(FINDINGS)
    sink.log_report(page)  # the page write_report returns names its folder
    sink.finish()

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(sink.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "watched"
    expected = expected_values(results)
    for key in {key for key, _ in expected}:
        history = {m.step: m.value for m in client.get_metric_history(sink.run_id, key.replace("(root)", "_root_"))}
        assert history == pytest.approx({step: v for (k, step), v in expected.items() if k == key}, rel=1e-12), key
    loss_history = sorted((m.step, m.value) for m in client.get_metric_history(sink.run_id, "hookscope/loss"))
    assert [value for _, value in loss_history] == pytest.approx(losses, rel=1e-6)
    assert run.data.metrics["gradients/2.bias/norm"] == pytest.approx(float(results.param_grads["2.bias"]["norm"][-1]))

    files = {item.path for item in client.list_artifacts(sink.run_id, "hookscope/report")}
    assert {"hookscope/report/report.html", "hookscope/report/results.safetensors"} <= files
    table_file = client.download_artifacts(sink.run_id, "hookscope/findings.json", str(tmp_path))
    table = json.loads(Path(table_file).read_text())
    assert table["data"][1][:5] == ["warning", "lr_too_high", "(model)", None, "updates <b>large</b>"]
    assert json.loads(table["data"][0][6]) == {"fraction": 0.375}


def test_mlflow_sink_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"run_id must be an MLflow run id \(letters, digits, - and _\), got 'a/b'"):
        MLflowSink("a/b")
    with pytest.raises(ValueError, match=r"experiment must be non-empty text without control characters, got ''"):
        MLflowSink(experiment="")


# ---- names and missing extras -----------------------------------------------------------------------------------
def test_names_are_made_valid_distinct_and_short() -> None:
    names = KeyNames(r"[\w./ :-]", 40)
    assert names("activations/(root)/mean") == "activations/_root_/mean"
    assert names("activations/a<b/mean") == "activations/a_b/mean"
    assert names("activations/a>b/mean") == "activations/a_b/mean~2"  # both would end as a_b
    assert names("activations/a<b/mean") == "activations/a_b/mean"  # the same name every time
    long = names("activations/" + "x" * 100 + "/mean")
    assert len(long) <= 40 and long != names("activations/" + "x" * 101 + "/mean")


def test_step_rows_group_the_records_by_step() -> None:
    results = WatchResults(steps=torch.tensor([3, 5]), layers={"": "Net"})
    results.activations[""] = {"mean": torch.tensor([1.0, math.nan], dtype=torch.float64)}
    results.losses = torch.tensor([0.5, 0.25], dtype=torch.float64)
    assert step_rows(results) == [
        (3, {"activations/(root)/mean": 1.0, "hookscope/loss": 0.5}),
        (5, {"hookscope/loss": 0.25}),  # not observed at step 5: no value, rather than NaN
    ]


@pytest.mark.parametrize(("sink", "module"), [(WandbSink, "wandb"), (MLflowSink, "mlflow")])
def test_a_missing_tracker_names_its_extra(sink: type, module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def refuse(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == module or name.startswith(f"{module}."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)
    monkeypatch.setattr(importlib, "import_module", lambda name: refuse(name))
    message = f"{sink.__name__} needs {module}, not installed: pip install 'hookscope\\[{module}\\]'"
    with pytest.raises(ImportError, match=message):
        sink()
