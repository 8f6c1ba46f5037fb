"""Sinks: where `watch()` sends each flushed block of recorded steps (CSV, JSON lines, TensorBoard).

A sink is any object with `write(results: WatchResults) -> None` (the newly recorded steps only) and
`close() -> None`. Sinks are written when the device buffers are flushed (every `buffer_steps` recorded steps,
on `results()` and at the end), never per step.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .._check import checked, hint_for
from .._io import check_target
from ..results._results import WatchResults

__all__ = ["CSVSink", "JSONLSink", "Sink", "TensorBoardSink"]

_FIELDS = ["step", "group", "name", "stat", "value"]


@runtime_checkable
class Sink(Protocol):
    """Receives blocks of newly recorded steps."""

    def write(self, results: WatchResults) -> None:
        """Take the newly recorded steps."""

    def close(self) -> None:
        """Flush and release files; a later `write` may reopen them."""


hint_for(Sink, "an object with write(results) and close(): CSVSink(path), JSONLSink(path), TensorBoardSink(log_dir)")


class CSVSink:
    """Append long-format rows `step,group,name,stat,value` to a CSV file (header written once)."""

    @checked()
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        check_target(self.path)

    def write(self, results: WatchResults) -> None:
        """Append the rows of `results.to_records()`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        is_new = not self.path.exists() or self.path.stat().st_size == 0
        with self.path.open("a", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=_FIELDS)
            if is_new:
                writer.writeheader()
            writer.writerows(results.to_records())

    def close(self) -> None:
        """Nothing to release (each write opens and closes the file)."""


class JSONLSink:
    """Append one JSON object per recorded value, `{"step", "group", "name", "stat", "value"}`, one per line."""

    @checked()
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        check_target(self.path)

    def write(self, results: WatchResults) -> None:
        """Append the rows of `results.to_records()` (non-finite values written as null)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            for row in results.to_records():
                value = row["value"]
                row["value"] = value if math.isfinite(value) else None
                handle.write(json.dumps(row) + "\n")

    def close(self) -> None:
        """Nothing to release (each write opens and closes the file)."""


class TensorBoardSink:
    """Write scalars `group/name/stat` and histograms `histograms/name` with `torch.utils.tensorboard`.

    Args:
        log_dir: The TensorBoard log folder (a `SummaryWriter` is created on the first write), or `None`
            with `writer`.
        writer: An existing `SummaryWriter` to write to (not closed by `close`).

    Raises:
        ValueError: neither or both of `log_dir` and `writer` are given.
    """

    @checked()
    def __init__(self, log_dir: str | os.PathLike[str] | None = None, *, writer: Any = None) -> None:
        if (log_dir is None) == (writer is None):
            raise ValueError("TensorBoardSink needs exactly one of log_dir or writer, got both or neither")
        self.log_dir = None if log_dir is None else Path(log_dir)
        if self.log_dir is not None and self.log_dir.exists() and not self.log_dir.is_dir():
            raise ValueError(f"log_dir must be a folder, got the file {str(self.log_dir)!r}; choose a folder name")
        self._writer = writer
        self._owns_writer = writer is None

    def _get_writer(self) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.log_dir))
        return self._writer

    def write(self, results: WatchResults) -> None:
        """Add every recorded value as a scalar and every histogram with its edges."""
        writer = self._get_writer()
        for row in results.to_records():
            writer.add_scalar(f"{row['group']}/{row['name']}/{row['stat']}", row["value"], row["step"])
        for name, counts in results.histograms.items():
            edges = results.hist_edges.get(name)
            if edges is not None:
                self._histograms(writer, name, counts, edges, results)
        writer.flush()

    @staticmethod
    def _histograms(writer: Any, name: str, counts: Any, edges: Any, results: WatchResults) -> None:
        stats = results.activations.get(name, {})
        for index, step in enumerate(results.steps.tolist()):
            row = counts[index]
            total = float(row.sum())
            if total == 0:
                continue
            mean, rms = (float(stats[s][index]) if s in stats else 0.0 for s in ("mean", "rms"))
            writer.add_histogram_raw(
                f"histograms/{name}", min=float(edges[0]), max=float(edges[-1]), num=total, sum=mean * total,
                sum_squares=rms * rms * total, bucket_limits=edges[1:].tolist(), bucket_counts=row.tolist(),
                global_step=step,
            )  # fmt: skip

    def close(self) -> None:
        """Close the writer this sink created."""
        if self._writer is not None and self._owns_writer:
            self._writer.close()
            self._writer = None
