"""Write the reports of `hookscope run`: one per watched model (with summary and diagnosis), and an index."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..report import safe_filename, write_index, write_report
from ..watch import WatchResults
from ._session import RunSession, WatchedModel

__all__ = ["write_run_reports"]


def write_run_reports(out: Path, session: RunSession, meta: dict[str, Any]) -> Path:
    """Write a report per watched model into `out` (one model) or `out/<n>-<Model>/` (several, with an index).

    Returns:
        The page to open.
    """
    notes = list(session.notes)
    if not session.watched:
        if not notes:
            notes.append(
                "no model was trained (no backward reached a model run in training mode), so nothing was watched"
            )
        return write_report(out, WatchResults(), meta={**meta, "notes": " | ".join(notes)})
    pages = []
    for index, entry in enumerate(session.watched, start=1):
        folder = out if len(session.watched) == 1 else out / f"{index}-{safe_filename(entry.name)}"
        pages.append((entry.name, _write_one(folder, entry, meta, notes)))
    if len(pages) == 1:
        return pages[0][1]
    return write_index(out, [(name, page.relative_to(out)) for name, page in pages], meta)


def _write_one(folder: Path, entry: WatchedModel, meta: dict[str, Any], notes: list[str]) -> Path:
    from ..doctor import diagnose, format_findings

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
            from ..summary import summary as summarize

            summary = summarize(model, *entry.first_args)
        except Exception as err:
            extra.append(f"the summary failed: {' '.join(str(err).split())}")
    page_meta = {**meta, "model": entry.name, **({"notes": " | ".join(extra)} if extra else {})}
    return write_report(folder, results, summary=summary, findings=findings, meta=page_meta, weights=model)
