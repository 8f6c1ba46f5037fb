"""The report's data beside the page: results (safetensors), a JSON document, weight histograms (safetensors)."""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from .._io import atomic_write, load_bundle, save_bundle
from ..results._results import RESULTS_FILE, WatchResults

__all__ = [
    "DOCUMENT_FILE",
    "RESULTS_FILE",
    "WEIGHTS_FILE",
    "ReportData",
    "finding_dict",
    "jsonable",
    "load_data",
    "prepare_data",
    "save_data",
]

DOCUMENT_FILE = "report.json"
WEIGHTS_FILE = "weights.safetensors"
_WEIGHTS_KIND = "weight_histograms"


@dataclasses.dataclass
class ReportData:
    """Everything a report page is drawn from, as saved beside it."""

    results: WatchResults
    meta: dict[str, Any]
    summary: dict[str, Any] | None
    findings: list[dict[str, Any]] | None
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]


def jsonable(value: Any) -> Any:
    """Return `value` as plain JSON data: tensors and arrays as lists, dataclasses as dicts, the rest as text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, torch.Tensor):
        return jsonable(value.detach().cpu().tolist() if value.numel() <= 64 else f"tensor{tuple(value.shape)}")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable({field.name: getattr(value, field.name) for field in dataclasses.fields(value)})
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    return str(value)


def finding_dict(finding: Any) -> dict[str, Any]:
    """Return a finding (a doctor `Finding`, a dataclass or a mapping) as a JSON-able dict."""
    if hasattr(finding, "to_dict"):
        finding = finding.to_dict()
    converted = jsonable(finding)
    return converted if isinstance(converted, dict) else {"message": converted}


def summary_dict(summary: Any) -> dict[str, Any] | None:
    """Return a model summary (a `ModelSummary` or its `to_dict()`) as a JSON-able dict."""
    if summary is None:
        return None
    converted = jsonable(summary.to_dict() if hasattr(summary, "to_dict") else summary)
    return converted if isinstance(converted, dict) else {"summary": converted}


def default_meta() -> dict[str, Any]:
    """Return what every report records about the run that wrote it."""
    from .._version import __version__

    return {
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "hookscope": __version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def prepare_data(
    results: WatchResults,
    summary: Any,
    findings: Iterable[Any] | None,
    meta: Mapping[str, Any] | None,
    weights: Mapping[str, tuple[torch.Tensor, torch.Tensor]] | None,
) -> ReportData:
    """Return what a page is drawn from, as it will be saved: metadata merged, summary and findings as JSON."""
    return ReportData(
        results=results,
        meta={**default_meta(), **jsonable(dict(results.meta)), **jsonable(dict(meta or {}))},
        summary=summary_dict(summary),
        findings=None if findings is None else [finding_dict(f) for f in findings],
        weights=dict(weights or {}),
    )


def save_data(folder: Path, data: ReportData) -> None:
    """Save `data` into `folder`, each file atomically; a weights file left from an earlier report is removed."""
    data.results.save(folder / RESULTS_FILE)
    if data.weights:
        tensors = {f"{kind}/{name}": pair[i] for name, pair in data.weights.items() for i, kind in enumerate("ce")}
        save_bundle(folder / WEIGHTS_FILE, tensors, {"names": list(data.weights)}, _WEIGHTS_KIND)
    else:
        (folder / WEIGHTS_FILE).unlink(missing_ok=True)
    document = {"meta": data.meta, "summary": data.summary, "findings": data.findings}
    atomic_write(folder / DOCUMENT_FILE, json.dumps(document, indent=1, allow_nan=False))


def load_data(folder: Path) -> ReportData:
    """Load what `save_data` wrote in `folder` (never unpickles).

    Raises:
        FileNotFoundError: `folder` holds no hookscope report data.
        ValueError: A file is not what a report writes.
    """
    missing = [name for name in (RESULTS_FILE, DOCUMENT_FILE) if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"folder must hold a hookscope report's data ({RESULTS_FILE}, {DOCUMENT_FILE}), got {str(folder)!r} "
            f"without {', '.join(missing)}; write one with hookscope.report.write_report"
        )
    document = json.loads((folder / DOCUMENT_FILE).read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError(f"{DOCUMENT_FILE} in {str(folder)!r} must hold a JSON object, got {type(document).__name__}")
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    if (folder / WEIGHTS_FILE).is_file():
        tensors, saved = load_bundle(folder / WEIGHTS_FILE, _WEIGHTS_KIND)
        weights = {name: (tensors[f"c/{name}"], tensors[f"e/{name}"]) for name in saved.get("names", [])}
    return ReportData(
        results=WatchResults.load(folder / RESULTS_FILE),
        meta=dict(document.get("meta") or {}),
        summary=document.get("summary"),
        findings=document.get("findings"),
        weights=weights,
    )
