"""write_report / render_report: the page and its data, written atomically into one folder."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .._check import checked
from .._io import atomic_write
from ..results._results import WatchResults
from ._data import DOCUMENT_FILE, RESULTS_FILE, WEIGHTS_FILE, ReportData, load_data, prepare_data, save_data
from ._html import INDEX_TITLE, IndexEntry, render_index, render_page

__all__ = ["REPORT_FILE", "remove_report", "render_report", "save_report_data", "write_index", "write_report"]

REPORT_FILE = "report.html"


@checked()
def write_report(
    out_dir: str | os.PathLike[str],
    results: WatchResults,
    *,
    summary: Any = None,
    findings: Iterable[Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    weights: nn.Module | Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write one self-contained HTML report of `results` into `out_dir`, with its data beside it.

    The page (`report.html`) works offline: plots are inline PNG images, styles are inline, there is no script
    and its Content-Security-Policy forbids any. Findings come first, then the model summary, overview plots and
    one section per layer. Every name is HTML-escaped with bidi controls shown as `<U+202E>`. Beside it:
    `results.safetensors` (`WatchResults.save`), `report.json` (metadata, summary, findings) and, when `weights`
    is given, `weights.safetensors` (histograms of each parameter); `render_report(out_dir)` draws the page again
    from them. Each file is written atomically.

    Args:
        out_dir: The folder to write into (created when missing).
        results: What `watch()` collected.
        summary: A `ModelSummary` (or its `to_dict()`), shown as a table.
        findings: The doctor's findings (`diagnose(results)`), shown first in the given (ranked) order.
        meta: Run metadata to show (e.g. `{"status": "raised", "error": "...", "script": "train.py"}`); a status
            other than `"completed"` puts a banner at the top of the page.
        weights: A model or a name -> tensor mapping whose weight distributions to draw.

    Returns:
        The path of the HTML page.

    Raises:
        TypeError: `results` is not a `WatchResults`.
        ValueError: `out_dir` exists and is not a folder.
    """
    folder, data = _prepare(out_dir, results, summary, findings, meta, weights)
    page = render_page(data)  # before any write: a failure while drawing leaves the previous report whole
    save_data(folder, data)
    return _readable(atomic_write(folder / REPORT_FILE, page), folder)


@checked()
def save_report_data(
    out_dir: str | os.PathLike[str],
    results: WatchResults,
    *,
    summary: Any = None,
    findings: Iterable[Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    weights: nn.Module | Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Save what `write_report` draws into `out_dir`, without drawing; `render_report(out_dir)` draws it after.

    For data that matters more than its page (`hookscope run` after a long training run): nothing here needs
    matplotlib, so the data is on disk before any drawing starts, and a drawing that fails loses nothing. The
    arguments are `write_report`'s.

    Returns:
        The folder.

    Raises:
        TypeError: `results` is not a `WatchResults`.
        ValueError: `out_dir` exists and is not a folder.
    """
    folder, data = _prepare(out_dir, results, summary, findings, meta, weights)
    save_data(folder, data)
    _readable(folder / RESULTS_FILE, folder)
    return folder


def _prepare(
    out_dir: str | os.PathLike[str],
    results: WatchResults,
    summary: Any,
    findings: Iterable[Any] | None,
    meta: Mapping[str, Any] | None,
    weights: nn.Module | Mapping[str, torch.Tensor] | None,
) -> tuple[Path, ReportData]:
    """Check the arguments, create the folder, and return it with the data the page is drawn from."""
    if not isinstance(results, WatchResults):
        raise TypeError(f"results must be a WatchResults (from watch().results()), got {type(results).__name__}")
    folder = Path(out_dir)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"out_dir must be a folder, got the file {str(folder)!r}; pick another --out")
    folder.mkdir(parents=True, exist_ok=True)
    histograms = None
    if weights is not None:
        from ..plot._weights import weight_histograms

        histograms = weight_histograms(weights)
    return folder, prepare_data(results, summary, findings, meta, histograms)


@checked()
def render_report(out_dir: str | os.PathLike[str]) -> Path:
    """Draw the report page again from the data `write_report` saved in `out_dir`; return the page's path.

    Raises:
        FileNotFoundError: `out_dir` holds no report data.
        ValueError: A data file is not what a report writes (pickles are never loaded).
    """
    folder = Path(out_dir)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"out_dir must be a report folder, got the file {str(folder)!r}")
    return _readable(atomic_write(folder / REPORT_FILE, render_page(load_data(folder))), folder)


def _readable(page: Path, folder: Path) -> Path:
    """Give the report's files the permissions of ordinary new files (temporary files start as 0600)."""
    umask = _umask()
    for name in (REPORT_FILE, RESULTS_FILE, DOCUMENT_FILE, WEIGHTS_FILE):
        if (folder / name).is_file():
            (folder / name).chmod(0o666 & ~umask)
    return page


def _umask() -> int:
    """Read the process umask without changing it (os.umask would, for a moment, in every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


@checked()
def remove_report(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Remove the files an earlier report wrote into `out_dir`, and nothing else; return the removed paths.

    A folder is a report's when its `report.json` is one hookscope wrote (its metadata names the hookscope
    version): then `report.html`, `results.safetensors`, `report.json` and `weights.safetensors` go. An index
    page (`write_index`) is recognised by its title. Any other file, and the folder itself, stay.

    Raises:
        ValueError: `out_dir` is a file.
    """
    folder = Path(out_dir)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"out_dir must be a report folder, got the file {str(folder)!r}")
    names: tuple[str, ...] = ()
    if _is_report_data(folder / DOCUMENT_FILE):
        names = (REPORT_FILE, RESULTS_FILE, DOCUMENT_FILE, WEIGHTS_FILE)
    elif _is_index(folder / REPORT_FILE):
        names = (REPORT_FILE,)
    removed = [folder / name for name in names if (folder / name).is_file()]
    for path in removed:
        path.unlink()
    return removed


def _is_report_data(path: Path) -> bool:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and isinstance(document.get("meta"), dict) and "hookscope" in document["meta"]


def _is_index(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8", errors="replace") as page:
            return f"<title>{INDEX_TITLE}</title>" in page.read(2048)
    except OSError:
        return False


@checked()
def write_index(out_dir: str | os.PathLike[str], pages: list[tuple[str, Path]], meta: Mapping[str, Any]) -> Path:
    """Write `out_dir/report.html` linking to one report per model (`pages`: name and path relative to it),
    with each model's findings read from the `report.json` beside its page."""
    folder = Path(out_dir)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"out_dir must be a folder, got the file {str(folder)!r}; pick another --out")
    entries: list[IndexEntry] = [(name, page.as_posix(), _saved_findings(folder / page.parent)) for name, page in pages]
    page = render_index(entries, str(meta.get("status", "completed")))
    return _readable(atomic_write(folder / REPORT_FILE, page), folder)


def _saved_findings(folder: Path) -> list[dict[str, Any]] | None:
    """The findings saved in `folder`'s report.json (`None`: none saved, or the diagnosis was not run)."""
    try:
        document = json.loads((folder / DOCUMENT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    findings = document.get("findings") if isinstance(document, dict) else None
    return [f for f in findings if isinstance(f, dict)] if isinstance(findings, list) else None
