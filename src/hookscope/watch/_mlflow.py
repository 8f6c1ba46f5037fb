"""`MLflowSink`: what `watch()` records, logged to an MLflow run at the flush cadence.

Each flushed block (already on the host: the sink never touches a device) becomes `log_batch` calls of metrics
with their recorded step, under the names `_trackers.py` gives, made valid for MLflow (characters it refuses
become `_`, at most 250 characters). MLflow has no histogram type: histograms stay in the report, which
`log_report` uploads as artifacts; `log_findings` writes the findings as a JSON table. Everything goes through
an `MlflowClient` and the run's id, so the sink works with or without an active run of MLflow's fluent API.
mlflow is imported when the sink is made, so a missing extra is said before training starts.
"""

from __future__ import annotations

import os
import time
import unicodedata
from collections.abc import Iterable
from typing import Any

from .._check import checked
from ..results._results import WatchResults
from ._trackers import FINDING_COLUMNS, KeyNames, finding_rows, import_extra, report_folder, step_rows

__all__ = ["ARTIFACT_FOLDER", "MLflowSink"]

ARTIFACT_FOLDER = "hookscope"
"""The run's artifact folder for findings (`findings.json`) and the report (`report/`)."""
_BATCH = 1000  # MLflow takes at most 1000 metrics per log_batch
_NAME = r"[\w./ :-]"  # one character MLflow accepts in a metric name
_MAX_NAME = 250


class MLflowSink:
    """Log what `watch()` records to an MLflow run: metrics per recorded step, findings and the report as artifacts.

    Use as `watch(model, opt, sinks=[MLflowSink()])`. The run is the one `run_id` names, else MLflow's active run
    (`mlflow.active_run()`) at the first write, else one the sink creates in `experiment`; a run the sink created
    stays open after the watch ends, so that findings and the report can join it, until `finish()`.

    Args:
        run_id: The id of the run to log to; `None`: the active run, or a new one.
        tracking_uri: Where the runs are kept (`"file:./mlruns"`, `"sqlite:///mlflow.db"`, a server);
            `None`: MLflow's own setting (`MLFLOW_TRACKING_URI`).
        experiment: The experiment of a run the sink creates (made when missing); `None`: MLflow's default one.
        run_name: The name of a run the sink creates.

    Raises:
        ImportError: mlflow is not installed (`pip install 'hookscope[mlflow]'`).
        ValueError: `run_id` is not a run id, or a name holds control characters.

    Example:
        >>> sink = MLflowSink(tracking_uri="file:./mlruns", experiment="demo")  # doctest: +SKIP
        >>> with watch(model, opt, sinks=[sink]) as w:  # doctest: +SKIP
        ...     train()
        >>> sink.log_findings(diagnose(w.results())); sink.finish()  # doctest: +SKIP
    """

    @checked()
    def __init__(
        self,
        run_id: str | None = None,
        *,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        run_name: str | None = None,
    ) -> None:
        if run_id is not None and not (run_id and all(c.isalnum() or c in "-_" for c in run_id)):
            raise ValueError(f"run_id must be an MLflow run id (letters, digits, - and _), got {run_id!r}")
        for argument, value in (("tracking_uri", tracking_uri), ("experiment", experiment), ("run_name", run_name)):
            if value is not None and (not value or any(unicodedata.category(c) in ("Cc", "Cf") for c in value)):
                raise ValueError(f"{argument} must be non-empty text without control characters, got {value!r}")
        self._mlflow = import_extra("mlflow", "MLflowSink", "mlflow")
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self._run_id = run_id
        self._owns_run = False
        self._client: Any = None
        self._names = KeyNames(_NAME, _MAX_NAME)

    @property
    def client(self) -> Any:
        """The `MlflowClient` logged through (made on first use)."""
        if self._client is None:
            self._client = self._mlflow.MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    @property
    def run_id(self) -> str:
        """The id of the run logged to (found or created on first use)."""
        if self._run_id is None:
            active = self._mlflow.active_run()
            if active is not None:
                self._run_id = str(active.info.run_id)
            else:
                run = self.client.create_run(self._experiment_id(), run_name=self.run_name)
                self._run_id, self._owns_run = str(run.info.run_id), True
        return self._run_id

    def _experiment_id(self) -> str:
        if self.experiment is None:
            return "0"  # MLflow's default experiment
        found = self.client.get_experiment_by_name(self.experiment)
        return str(found.experiment_id) if found is not None else str(self.client.create_experiment(self.experiment))

    def write(self, results: WatchResults) -> None:
        """Log every recorded value of `results` as a metric at its recorded step."""
        from mlflow.entities import Metric

        run_id, now = self.run_id, int(time.time() * 1000)
        metrics = [
            Metric(key, value, now, step) for step, row in step_rows(results, self._names) for key, value in row.items()
        ]
        for start in range(0, len(metrics), _BATCH):
            self.client.log_batch(run_id, metrics=metrics[start : start + _BATCH])

    def log_findings(self, findings: Iterable[Any]) -> None:
        """Write the doctor's findings (`diagnose(results)`) to `hookscope/findings.json`, as a table:
        `{"columns": FINDING_COLUMNS, "data": [[...], ...]}` (the layout of MLflow's own `log_table`).

        Raises:
            TypeError: an item is not a finding.
        """
        table = {"columns": list(FINDING_COLUMNS), "data": finding_rows(findings)}
        self.client.log_dict(self.run_id, table, f"{ARTIFACT_FOLDER}/findings.json")

    @checked()
    def log_report(self, folder: str | os.PathLike[str]) -> None:
        """Upload a report to `hookscope/report/`: the page, `results.safetensors` and `report.json`.

        Args:
            folder: The report's folder (`hookscope.report.write_report(folder, ...)`), or the page it returned.

        Raises:
            ValueError: `folder` is neither a folder nor a file in one.
        """
        path = report_folder(folder)
        self.client.log_artifacts(self.run_id, str(path), f"{ARTIFACT_FOLDER}/report")

    def close(self) -> None:
        """Nothing to release: the run stays open for findings and the report (`finish` ends it)."""

    def finish(self) -> None:
        """Mark the run finished if this sink created it (a run given or active stays open)."""
        if self._run_id is not None and self._owns_run:
            self.client.set_terminated(self._run_id)
            self._owns_run = False
