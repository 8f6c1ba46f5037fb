"""`WandbSink`: what `watch()` records, logged to a Weights & Biases run at the flush cadence.

Each flushed block (already on the host: the sink never touches a device) becomes one `run.log` per recorded
step, under the names `_trackers.py` gives (`gradients/<name>/norm`, `parameters/<name>/update_ratio`,
`activations/<path>/mean` ...), with the recorded step as `hookscope/step`, the x axis of those charts
(`define_metric`), and each layer's output histogram as a `wandb.Histogram` (`activations/<path>/histogram`).
Findings and the report go to the run when asked (`log_findings`, `log_report`). wandb is imported when the
sink is made, so a missing extra is said before training starts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

from .._check import checked
from ..results._results import WatchResults
from ._trackers import FINDING_COLUMNS, LOSS_KEY, PREFIXES, STEP_KEY, finding_rows, import_extra, report_folder
from ._trackers import step_rows as _step_rows
from ._trackers import tracker_key as _tracker_key

__all__ = ["MAX_BINS", "WandbSink"]

MAX_BINS = 512
"""The most bins a `wandb.Histogram` takes; a histogram with more has adjacent bins added together."""


class WandbSink:
    """Log what `watch()` records to a W&B run: per-step values, histograms, and on request findings and the report.

    Use as `watch(model, opt, sinks=[WandbSink(project="my-project")])`. The run is the one given, else the
    active run (`wandb.run`) at the first write, else one the sink starts with `wandb.init(**init)`; a run the
    sink started stays open after the watch ends, so that findings and the report can join it, until `finish()`
    (or the end of the process). Each recorded step is one committed row (`run.log`) with the step in
    `hookscope/step`, which W&B draws hookscope's values against: log your own values to the same run without
    `step=` (W&B drops rows logged with a step below its current one), or give the sink a run of its own.

    Args:
        run: The `wandb` run to log to; `None`: the active run, or a new one.
        histograms: Log each layer's output histogram every recorded step.
        **init: Keywords of `wandb.init` (`project=`, `name=`, `mode="offline"` ...) for the run the sink starts.

    Raises:
        ImportError: wandb is not installed (`pip install 'hookscope[wandb]'`).
        TypeError: `run` is not a wandb run.
        ValueError: both `run` and `init` keywords are given.

    Example:
        >>> sink = WandbSink(project="demo", mode="disabled")  # doctest: +SKIP
        >>> with watch(model, opt, sinks=[sink]) as w:  # doctest: +SKIP
        ...     train()
        >>> sink.log_findings(diagnose(w.results())); sink.finish()  # doctest: +SKIP
    """

    @checked()
    def __init__(self, run: Any = None, *, histograms: bool = True, **init: Any) -> None:
        self._wandb = import_extra("wandb", "WandbSink", "wandb")
        if run is not None and not (callable(getattr(run, "log", None)) and hasattr(run, "define_metric")):
            raise TypeError(f"run must be a wandb run (wandb.init()) or None, got {type(run).__name__}")
        if run is not None and init:
            raise ValueError(
                f"run and wandb.init keywords cannot both be given, got run and {sorted(init)!r}; pass one"
            )
        self.histograms = histograms
        self._init = init
        self._run = run
        self._owns_run = False
        self._defined = False

    @property
    def run(self) -> Any:
        """The W&B run logged to (found or started on first use)."""
        if self._run is None:
            active = self._wandb.run
            if active is not None and not self._init:
                self._run = active
            else:
                self._run = self._wandb.init(**self._init)
                self._owns_run = True
        if not self._defined:
            self._run.define_metric(STEP_KEY)
            for prefix in PREFIXES:
                self._run.define_metric(f"{prefix}/*", step_metric=STEP_KEY)
            self._run.define_metric(LOSS_KEY, step_metric=STEP_KEY)
            self._defined = True
        return self._run

    def write(self, results: WatchResults) -> None:
        """Log one row per recorded step of `results`: its values, histograms and `hookscope/step`."""
        run = self.run
        histograms = self._histograms(results) if self.histograms else {}
        rows = dict(_step_rows(results))
        for step in sorted(set(rows) | set(histograms)):
            run.log({STEP_KEY: step, **rows.get(step, {}), **histograms.get(step, {})})

    def _histograms(self, results: WatchResults) -> dict[int, dict[str, Any]]:
        """`{step: {"activations/<path>/histogram": wandb.Histogram}}` for every step a layer has counts."""
        out: dict[int, dict[str, Any]] = {}
        steps = results.steps.tolist()
        for path, counts in results.histograms.items():
            edges = results.hist_edges.get(path)
            if edges is None:
                continue
            counts, edges = _fit_bins(counts, edges)
            key = _tracker_key("activations", path, "histogram")
            totals = counts.sum(dim=1).tolist()
            for index, step in enumerate(steps):
                if totals[index] > 0:
                    histogram = self._wandb.Histogram(np_histogram=(counts[index].tolist(), edges.tolist()))
                    out.setdefault(step, {})[key] = histogram
        return out

    def log_findings(self, findings: Iterable[Any]) -> None:
        """Log the doctor's findings (`diagnose(results)`) as a table, `hookscope/findings` (`FINDING_COLUMNS`).

        Raises:
            TypeError: an item is not a finding.
        """
        rows = finding_rows(findings)
        self.run.log({"hookscope/findings": self._wandb.Table(columns=list(FINDING_COLUMNS), data=rows)})

    @checked()
    def log_report(self, folder: str | os.PathLike[str]) -> None:
        """Upload a report as an artifact of type `hookscope-report`: the page, `results.safetensors`, `report.json`.

        Args:
            folder: The report's folder (`hookscope.report.write_report(folder, ...)`), or the page it returned.

        Raises:
            ValueError: `folder` is neither a folder nor a file in one.
        """
        path = report_folder(folder)
        run = self.run
        artifact = self._wandb.Artifact(name=f"hookscope-report-{run.id}", type="hookscope-report")
        artifact.add_dir(str(path))
        run.log_artifact(artifact)

    def close(self) -> None:
        """Nothing to release: the run stays open for findings and the report (`finish` ends it)."""

    def finish(self) -> None:
        """End the run if this sink started it (a run given or found stays open)."""
        if self._run is not None and self._owns_run:
            self._run.finish()
            self._run, self._owns_run, self._defined = None, False, False


def _fit_bins(counts: torch.Tensor, edges: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Add adjacent bins together until at most `MAX_BINS` remain (counts (S, bins), edges (bins + 1,)).

    >>> counts, edges = _fit_bins(torch.ones(1, 1030), torch.arange(1031.0))
    >>> counts.shape, edges.shape, float(counts.sum()), edges[[0, -1]].tolist()
    (torch.Size([1, 344]), torch.Size([345]), 1030.0, [0.0, 1030.0])
    """
    bins = counts.shape[1]
    if bins <= MAX_BINS:
        return counts, edges
    factor = -(-bins // MAX_BINS)
    starts = torch.arange(0, bins, factor)
    merged = torch.stack([counts[:, int(i) : int(i) + factor].sum(dim=1) for i in starts], dim=1)
    return merged, torch.cat([edges[starts], edges[-1:]])
