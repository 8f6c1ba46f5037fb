"""Write the reports of `hookscope run`: one per watched model (with summary and diagnosis), and an index.

Every model's data is saved before any page is drawn: a drawing that fails (matplotlib missing) loses nothing,
and `hookscope report DIR` draws the pages later from what was saved.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..report import remove_report, render_report, save_report_data
from ..report._data import DOCUMENT_FILE
from ..report._escape import safe_filename
from ..report._write import write_index
from ..results._results import WatchResults
from ._errors import require_extra
from ._session import RunSession, WatchedModel

__all__ = ["remove_previous", "shown_path", "write_run_reports"]


def write_run_reports(out: Path, session: RunSession, meta: dict[str, Any]) -> Path:
    """Save each watched model's data into `out` (one model) or `out/<n>-<Model>/` (several), then draw the pages.

    What an earlier run wrote into `out` goes first (`remove_previous`), so `hookscope report out` never draws an
    older run.

    Returns:
        The page to open (the index when several models were watched).

    Raises:
        MissingExtraError: matplotlib is missing; the data is saved, the pages are not drawn.
    """
    notes = list(session.notes)
    remove_previous(out)
    if not session.watched:
        if not notes:
            notes.append(
                "no model was trained (no backward reached a model run in training mode), so nothing was watched"
            )
        folders = [("", save_report_data(out, WatchResults(), meta={**meta, "notes": " | ".join(notes)}))]
    else:
        folders = []
        for index, entry in enumerate(session.watched, start=1):
            folder = out if len(session.watched) == 1 else out / f"{index}-{safe_filename(entry.name)}"
            folders.append((entry.name, _save_one(folder, entry, meta, notes)))
    shown = shown_path(out)
    where, redraw = (
        (shown, f"hookscope report {shown}") if len(folders) == 1 else (f"{shown}/*/", "hookscope report on each")
    )
    require_extra("plot", f"the data is saved in {where}, but drawing report.html", then=redraw)
    pages = [(name, render_report(folder)) for name, folder in folders]
    if len(pages) == 1:
        return pages[0][1]
    return write_index(out, [(name, page.relative_to(out)) for name, page in pages], meta)


def shown_path(path: Path) -> Path:
    """`path` as the user reads it: relative to the working directory when inside it (`hookscope run` is back
    where it started when it writes), else absolute."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def remove_previous(out: Path) -> None:
    """Remove the report files an earlier run wrote into `out`: its page, data and index, and each model's folder
    (`<n>-<Model>/`) when nothing else is left in it. Files hookscope did not write are never touched."""
    if not out.is_dir():
        return
    remove_report(out)
    for folder in out.iterdir():
        if folder.is_dir() and folder.name.partition("-")[0].isdigit() and (folder / DOCUMENT_FILE).is_file():
            remove_report(folder)
            if not any(folder.iterdir()):
                folder.rmdir()


def _save_one(folder: Path, entry: WatchedModel, meta: dict[str, Any], notes: list[str]) -> Path:
    from ..doctor._diagnose import diagnose
    from ..doctor._finding import format_findings

    results = entry.watcher.results()
    findings, summary = None, None
    model = entry.model
    extra = list(notes)
    try:
        findings = diagnose(results)
        print(f"{entry.name}: {format_findings(findings)}", file=sys.stderr)
    except Exception as err:
        extra.append(f"the diagnosis failed: {err}")
    if entry.first_args:
        try:
            from ..summary._api import summary as summarize

            summary = summarize(model, *entry.first_args)
        except Exception as err:
            extra.append(f"the summary failed: {' '.join(str(err).split())}")
    page_meta = {**meta, "model": entry.name, **({"notes": " | ".join(extra)} if extra else {})}
    return save_report_data(folder, results, summary=summary, findings=findings, meta=page_meta, weights=model)
