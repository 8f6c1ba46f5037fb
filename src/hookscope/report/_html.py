"""The report page: one self-contained HTML document (inline CSS, plots as base64 PNG, no script, no network)."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from .._html import table
from .._text import display_name, strip_terminal_codes
from ..stats._tables import SMALL_BELOW
from ._data import DOCUMENT_FILE, RESULTS_FILE, WEIGHTS_FILE, ReportData
from ._escape import text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["CSP", "INDEX_TITLE", "MAX_LAYERS", "NAME_WIDTH", "IndexEntry", "figure_img", "render_index", "render_page"]

MAX_LAYERS = 100
"""The most layers drawn one by one; the others are named with a count (their series stay in the data file)."""
NAME_WIDTH = 120
"""The most characters of a layer name the page shows (shortened in the middle; the full name is in the data files
and, for headings, in the tooltip)."""

_CSS = """
body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1280px;padding:0 1.5em 3em;color:#1d2330}
h1{margin:.6em 0 .2em}h2{border-bottom:2px solid #d5dbe6;padding-bottom:.2em;margin-top:1.6em}
nav a{margin-right:1em}.muted{color:#667}.banner{background:#fde2e1;border:1px solid #d9534f;padding:.7em 1em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}td,th{border:1px solid #d5dbe6;padding:.2em .5em;
text-align:left;vertical-align:top}th{background:#eef1f6}.num{text-align:right;font-variant-numeric:tabular-nums}
.finding{border-left:5px solid #999;background:#f7f8fa;margin:.6em 0;padding:.5em .9em;list-style:none}
.sev-error,.sev-critical{border-color:#d9534f}.sev-warning{border-color:#f0ad4e}.sev-info{border-color:#5bc0de}
.badge{font-weight:bold;text-transform:uppercase;font-size:.8em;margin-right:.6em}
img{max-width:100%;height:auto;display:block;margin:.4em 0}code{background:#eef1f6;padding:0 .2em}
ul.findings{padding:0}.layer{margin-top:1.2em}
"""
INDEX_TITLE = "hookscope reports"
"""The title of the index page of a run that watched several models (how `remove_report` recognises one)."""
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def figure_img(figure: Figure, alt: str, dpi: int = 80) -> str:
    """Return an `<img>` element holding `figure` as an inline base64 PNG."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="{text(alt)}" src="data:image/png;base64,{encoded}">'


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    return table(header, rows, styled=False)


def _header(data: ReportData) -> str:
    meta = data.meta
    title = f"hookscope report: {meta['model']}" if meta.get("model") else "hookscope report"
    status = str(meta.get("status", "completed"))
    banner = ""
    if status != "completed":
        detail = f": {strip_terminal_codes(str(meta['error']))}" if meta.get("error") else ""
        banner = (
            f'<p class="banner" id="status">The run did not complete ({text(status)}{text(detail)}). This report '
            f"covers the {data.results.num_steps} steps recorded until then.</p>"
        )
    keys = ("command", "created", "torch") if "command" in meta else ("script", "created", "torch")
    line = " · ".join(text(f"{key}: {meta[key]}") for key in keys if key in meta)
    nav = "".join(f'<a href="#{anchor}">{name}</a>' for anchor, name in _SECTIONS)
    return f"<header><h1>{text(title)}</h1><p class='muted'>{line}</p>{banner}<nav>{nav}</nav></header>"


def _findings(data: ReportData) -> str:
    return f'<section id="findings"><h2>Diagnosis</h2>{_finding_list(data.findings)}</section>'


def _finding_list(findings: list[dict[str, Any]] | None) -> str:
    if findings is None:
        return "<p class='muted'>The diagnosis was not run for this report.</p>"
    if not findings:
        return "<p>No findings: nothing the checks look for went wrong.</p>"
    return "<ul class='findings'>" + "".join(_finding(f) for f in findings) + "</ul>"


def _finding(finding: dict[str, Any]) -> str:
    severity = str(finding.get("severity", "info")).lower()
    css = severity if severity in ("error", "critical", "warning", "info") else "info"
    check = finding.get("check") or finding.get("name") or finding.get("code") or ""
    where = finding.get("path", finding.get("layer"))
    layer = "" if where is None else f"layer {display_name(where, NAME_WIDTH)}"
    place = " · ".join(part for part in (layer, _step(finding.get("step"))) if part)
    parts = [f"<span class='badge'>{text(severity)}</span><strong>{text(check)}</strong> <span class='muted'>"]
    parts.append(f"{text(place)}</span>")
    if finding.get("message"):
        parts.append(f"<p>{text(finding['message'])}</p>")
    evidence = finding.get("evidence")
    if evidence:
        items = evidence.items() if isinstance(evidence, dict) else [("evidence", evidence)]
        parts.append("<p class='muted'>" + "; ".join(text(f"{k} = {v}") for k, v in items) + "</p>")
    if finding.get("advice"):
        parts.append(f"<p><em>Advice:</em> {text(finding['advice'])}</p>")
    return f"<li class='finding sev-{css}'>{''.join(parts)}</li>"


def _step(step: Any) -> str:
    return "" if step is None else f"step {step}"


_SUMMARY_COLUMNS = ("path", "type", "input_shape", "output_shape", "params", "trainable", "flops", "mode", "hooks")


def _summary(data: ReportData) -> str:
    summary = data.summary
    if summary is None:
        return "<section id='summary'><h2>Model summary</h2><p class='muted'>No model summary was given.</p></section>"
    rows = next((v for v in summary.values() if isinstance(v, list) and v and isinstance(v[0], dict)), [])
    present = list(dict.fromkeys(key for row in rows for key in row))
    columns = [c for c in _SUMMARY_COLUMNS if c in present and (c != "hooks" or any(r.get(c) for r in rows))]
    columns = columns or present
    cells = ([_summary_cell(row, c) for c in columns] for row in rows)
    table = _table(columns, cells) if rows else ""
    totals = summary["totals"] if isinstance(summary.get("totals"), dict) else summary
    scalars = [(k, v) for k, v in totals.items() if not isinstance(v, (list, dict))]
    return f"<section id='summary'><h2>Model summary</h2>{table}{_table(('total', 'value'), scalars)}</section>"


def _summary_cell(row: dict[str, Any], column: str) -> Any:
    value = row.get(column)
    if column == "path":
        depth = row["depth"] if isinstance(row.get("depth"), int) else 0
        return "\u00a0\u00a0" * depth + display_name(value or "", NAME_WIDTH)
    if isinstance(value, list) and column != "path":
        return str(value) if value else ""
    return value


def _overview(data: ReportData) -> str:
    from ..plot import plot_activations, plot_attention, plot_gradient_flow, plot_loss, plot_update_ratios
    from ..plot._weights import plot_weight_histograms

    results = data.results
    plots: list[tuple[bool, Callable[[], Figure], str]] = [
        (results.loss_series() is not None, lambda: plot_loss(results), "loss over steps"),
        (bool(results.activations), lambda: plot_activations(results), "activation statistics per layer"),
        (bool(results.output_grads), lambda: plot_gradient_flow(results), "gradient norm per layer"),
        (bool(results.param_grads), lambda: plot_gradient_flow(results, source="param"), "parameter gradients"),
        (bool(results.update_ratios), lambda: plot_update_ratios(results), "update to weight ratios"),
        (bool(data.weights), lambda: plot_weight_histograms(data.weights), "weight distributions"),
        (bool(results.attention), lambda: plot_attention(results), "attention per head: max logit and entropy"),
    ]
    images = "".join(figure_img(draw(), alt) for present, draw, alt in plots if present)
    if not images:
        images = "<p class='muted'>Nothing was recorded.</p>"
    measured = text(results.measured_text())
    return (
        f"<section id='overview'><h2>Overview</h2><p>{results.num_steps} recorded steps. {measured}</p>"
        f"{images}</section>"
    )


def _layers(data: ReportData) -> str:
    from ..plot import plot_layer
    from ..plot._watch import in_model_order

    results = data.results
    paths = list(dict.fromkeys([*results.layers, *in_model_order(results, results.activations)]))
    parts = []
    for index, path in enumerate(paths[:MAX_LAYERS]):
        kind = results.layers.get(path, "?")
        shown = display_name(path, NAME_WIDTH)
        heading = f"<h3 title='{text(path)}'>{text(shown)} <span class='muted'>{text(kind)}</span></h3>"
        if path in results.unobserved and path not in results.activations:
            body = f"<p class='muted'>Never observed: {text(results.unobserved[path])}</p>"
        else:
            body = _sampled_note(results.activations.get(path, {})) + figure_img(
                plot_layer(results, path), f"plots of layer {shown}"
            )
        parts.append(f"<section class='layer' id='layer-{index}'>{heading}{body}</section>")
    if len(paths) > MAX_LAYERS:
        rest = ", ".join(display_name(path, NAME_WIDTH) for path in paths[MAX_LAYERS:])
        parts.append(f"<p class='muted'>{len(paths) - MAX_LAYERS} more layers not drawn: {text(rest)}.</p>")
    if not parts:
        return "<section id='layers'><h2>Layers</h2><p>No layers were watched.</p></section>"
    return f"<section id='layers'><h2>Layers</h2>{_CONTAINER_NOTE}{''.join(parts)}</section>"


_CONTAINER_NOTE = (
    "<p class='muted' id='containers'>A layer whose output is a tuple, list or dict (an LSTM's "
    "<code>(output, (h, c))</code>, a transformer block's <code>(hidden, attention)</code>, a model output "
    "object) is described by its first floating-point tensor only; the other tensors are not recorded.</p>"
)


def _sampled_note(statistics: dict[str, Any]) -> str:
    """Say which recorded steps of a layer were described from a sample (its `sampled` column), if any."""
    sampled = statistics.get("sampled")
    if not isinstance(sampled, torch.Tensor):  # no sampled column: nothing to say
        return ""
    recorded = ~sampled.isnan()
    estimated = int((sampled[recorded] > 0).sum())
    if not estimated:
        return ""
    return (
        f"<p class='muted sampled'>Estimated from a sample in {estimated} of {int(recorded.sum())} recorded steps "
        f"(outputs of {SMALL_BELOW} values or more): std, the near-zero and saturated fractions, the histogram and "
        "unit activity are estimates; count, mean, min and max are exact (unless a value is non-finite). "
        "Watch with <code>exact=True</code> (<code>hookscope run --exact</code>) to describe every value.</p>"
    )


def _details(data: ReportData) -> str:
    results = data.results
    parts = [_table(("key", "value"), sorted((k, str(v)) for k, v in data.meta.items()))]
    for direction, where in results.first_nonfinite.items():
        if isinstance(where, dict):
            at = f"{display_name(where.get('path', ''), NAME_WIDTH)} at step {where.get('step')}"
            parts.append(f"<p>First non-finite value in {text(direction)}: {text(at)}</p>")
    if results.unobserved:
        rows = ((display_name(path, NAME_WIDTH), why) for path, why in results.unobserved.items())
        parts.append("<h3>Selected but never observed</h3>" + _table(("layer", "why"), rows))
    if results.dropped:
        parts.append("<h3>Observations not kept</h3>" + _table(("reason", "count"), results.dropped.items()))
    names = (RESULTS_FILE, DOCUMENT_FILE, *((WEIGHTS_FILE,) if data.weights else ()))
    files = ", ".join(f"<code>{name}</code>" for name in names)
    parts.append(f"<p class='muted'>Data beside this page: {files} (load with WatchResults.load).</p>")
    return f"<section id='details'><h2>Run details</h2>{''.join(parts)}</section>"


_SECTIONS = (
    ("findings", "Diagnosis"),
    ("summary", "Model summary"),
    ("overview", "Overview"),
    ("layers", "Layers"),
    ("details", "Run details"),
)


IndexEntry = tuple[str, str, "list[dict[str, Any]] | None"]
"""One model of an index page: its name, the link to its page (relative), and its findings (`None`: not run)."""


def render_index(entries: list[IndexEntry], status: str) -> str:
    """Return the index page of a run that watched several models: each model's link and its findings."""
    sections = []
    for name, link, findings in entries:
        folder = link.rpartition("/")[0]
        heading = f'<h2><a href="{text(link)}">{text(name)}</a> <code>{text(folder)}</code></h2>'
        sections.append(f"<section class='model'>{heading}{_finding_list(findings)}</section>")
    body = f"<h1>{INDEX_TITLE}</h1><p>{len(entries)} models were watched (run {text(status)}).</p>"
    return _document(INDEX_TITLE, body + "".join(sections))


def _document(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{title}</title><style>{_CSS}</style></head><body>{body}</body></html>\n"
    )


def render_page(data: ReportData) -> str:
    """Return the whole HTML document for `data`."""
    body = "".join((_header(data), _findings(data), _summary(data), _overview(data), _layers(data), _details(data)))
    return _document("hookscope report", body)
