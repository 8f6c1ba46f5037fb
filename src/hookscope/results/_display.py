"""`WatchResults` in a notebook: a one-line repr, and an HTML table of the layers with small plots of their series.

The table's figures are `WatchResults.summary()`'s (`layer_figures`: the last recorded step's mean, std,
output-gradient norm and non-finite count), each row followed by inline SVG line charts of the layer's mean, std
and gradient norm over the recorded steps (`hookscope._html.sparkline`): no matplotlib, no script, nothing that
opens a window. Every name is escaped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._html import cell, sparkline, table, text
from .._text import display_name

if TYPE_CHECKING:
    import torch

    from ._results import WatchResults

__all__ = ["MAX_LAYERS", "results_html", "results_repr"]

MAX_LAYERS = 50
"""The most layers the notebook table shows (the rest are counted; `summary()` and the report show them all)."""
_CHARTS = (("activations", "mean", "#3b6fb6"), ("activations", "std", "#6a9f3a"), ("output_grads", "norm", "#c0504d"))


def results_repr(results: WatchResults) -> str:
    """One line: how many steps and layers, and the loss at the first and last recorded steps.

    >>> from hookscope import WatchResults
    >>> WatchResults()
    WatchResults(0 recorded steps, 0 layers)
    """
    return f"WatchResults({_overview(results)})"


def _overview(results: WatchResults) -> str:
    steps = results.num_steps
    span = f" ({int(results.steps[0])}..{int(results.steps[-1])})" if steps else ""
    parts = [f"{steps} recorded step{'' if steps == 1 else 's'}{span}", f"{len(results.layers)} layers"]
    losses = results.losses
    if losses is not None and losses.numel():
        parts.append(f"loss {float(losses[0]):.4g} -> {float(losses[-1]):.4g}")
    return ", ".join(parts)


def results_html(results: WatchResults, max_layers: int = MAX_LAYERS) -> str:
    """Return `results` as an HTML fragment: the steps and loss, one row per layer with its last figures and
    its series drawn small, then what `summary()` notes (first non-finite values, unobserved layers, skipped
    and dropped steps)."""
    from ._results import FIGURES, layer_figures

    parts = [f"<p style='margin:.3em 0'><b>WatchResults</b>: {text(_overview(results))}</p>"]
    if results.losses is not None and results.losses.numel():
        parts.append(f"<p style='margin:.2em 0'>loss {_chart(results.losses, 'loss', '#444', 240)}</p>")
    paths = list(results.layers)[:max_layers]
    if results.num_steps and paths:
        header = ["layer", "type", *FIGURES, *(stat if stat != "norm" else "grad norm" for _, stat, _ in _CHARTS)]
        rows = []
        for path in paths:
            charts = [
                _chart(getattr(results, group).get(path, {}).get(stat), stat, color) for group, stat, color in _CHARTS
            ]
            rows.append([display_name(path), results.layers[path], *layer_figures(results, path), *charts])
        caption = "<p style='margin:.2em 0;color:#667'>last recorded step | over the recorded steps</p>"
        parts.append(caption + table(header, rows, raw=(6, 7, 8)))
    if len(results.layers) > max_layers:
        parts.append(f"<p>... {len(results.layers) - max_layers} more layers (results.summary(max_layers=...))</p>")
    parts += [f"<p style='margin:.2em 0'>{text(note)}</p>" for note in _notes(results)]
    return f"<div class='hookscope-results'>{''.join(parts)}</div>"


def _chart(values: torch.Tensor | None, title: str, color: str, width: int = 110) -> str:
    if values is None or not values.numel():
        return ""
    return sparkline(values.tolist(), width=width, title=title, color=color)


def _notes(results: WatchResults) -> list[str]:
    notes = []
    for direction, hit in (results.first_nonfinite or {}).items():
        if hit:
            notes.append(f"first non-finite ({direction}): {display_name(hit['path'])} at step {hit['step']}")
    notes += [f"unobserved: {display_name(path)}: {reason}" for path, reason in results.unobserved.items()]
    if results.skipped_steps:
        notes.append(f"skipped by the loss scaler: {len(results.skipped_steps)} steps")
    if results.dropped:
        notes.append(
            "not kept: " + ", ".join(f"{reason} {cell(count)}" for reason, count in sorted(results.dropped.items()))
        )
    return notes
