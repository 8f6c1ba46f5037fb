"""Shared plotting plumbing: figures without pyplot, arrays ready to draw, line panels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._text import display_name

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "LABEL_WIDTH",
    "MAX_LEGEND",
    "as_array",
    "axes_or_new",
    "draw_lines",
    "extremes",
    "few_ticks",
    "label",
    "near_zero_caption",
    "new_figure",
    "nonfinite_note",
    "steps_of",
]

MAX_LEGEND = 12
"""Above this many lines a panel colours lines by depth and leaves the legend out."""
LABEL_WIDTH = 60
"""The most characters of a name a title or legend shows (`hookscope._text.shorten_path`; the data keeps it whole)."""


def label(name: object, width: int = LABEL_WIDTH) -> str:
    """Return a name as matplotlib text: neutralized, shortened to `width`, `(root)` for `""`, `$` kept literal."""
    return display_name(name, width).replace("$", r"\$")


def near_zero_caption(threshold: object, *, signed: bool = False) -> str:
    """Name a near-zero percentage by its rule: `% |x| ≤ 1e-3` (watch), `% x ≤ 0.05` (`signed`: ActivationStats'
    fastai rule); `% near zero` when the threshold is unknown (results saved without it).

    >>> near_zero_caption(1e-3), near_zero_caption(0.05, signed=True), near_zero_caption(None)
    ('% |x| ≤ 1e-3', '% x ≤ 0.05', '% near zero')
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        return "% near zero"
    shown = f"{threshold:.3g}"
    if 0 < threshold < 0.01:
        shown = f"{threshold:.0e}".replace("e-0", "e-")
    return f"% x ≤ {shown}" if signed else f"% |x| ≤ {shown}"


def new_figure(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (8.0, 4.0)) -> tuple[Figure, Any]:
    """Return a Figure that pyplot does not track (no global state, freed with its last reference) and its axes.

    The figure renders with the Agg canvas, so nothing here needs a display and no window ever opens. In a
    notebook it shows as a PNG once, when a cell returns it (`display(figure)` elsewhere): pyplot does not know
    it, so the inline backend does not draw it a second time at the end of the cell.
    """
    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from ._figure import NotebookFigure  # imports matplotlib: only when a plot is drawn

    figure = NotebookFigure(figsize=figsize)
    FigureCanvasAgg(figure)
    with rc_context({"axes.titley": 1.0}):  # a fixed title place: placing it automatically measures every tick
        axes = figure.subplots(nrows, ncols, squeeze=False)
    # Fixed margins: constrained/tight layout cost more than the drawing itself.
    top = 1.0 - 0.75 / figsize[1]
    figure.subplots_adjust(left=0.08, right=0.98, bottom=0.55 / figsize[1], top=top, wspace=0.3, hspace=0.45)
    return figure, axes


def axes_or_new(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """Return `(figure, ax)`: the given axes and the figure they belong to, or a new figure with one axes."""
    if ax is None:
        figure, axes = new_figure(1, 1, figsize)
        return figure, axes[0][0]
    root = ax.get_figure(root=True)
    if root is None:
        raise ValueError("ax must belong to a figure, got axes without one")
    return root, ax


def as_array(values: torch.Tensor | Sequence[float] | np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Return `values` as a float64 array with every non-finite value set to NaN (drawn as a gap)."""
    if isinstance(values, torch.Tensor):
        array = values.detach().to("cpu", torch.float64).numpy()
    else:
        array = np.asarray(values, dtype=np.float64)
    finite: np.ndarray[Any, Any] = np.where(np.isfinite(array), array, np.nan)
    return finite


def steps_of(results: Any) -> np.ndarray[Any, Any]:
    """Return the recorded step numbers of `results` (a `WatchResults`)."""
    steps: np.ndarray[Any, Any] = results.steps.detach().to("cpu").numpy()
    return steps


def few_ticks(ax: Axes, y: bool = True) -> None:
    """At most about 4 labelled ticks per axis (whole steps on x): each tick costs more to draw than a line."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
    if y:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4))


def _log_axis(ax: Axes, low: float, high: float) -> None:
    """Use a log y axis for values in [low, high] with plain tick labels (mathtext ones cost more than the rest of
    the figure); within one decade, where a log axis has no labelled tick, ticks are placed inside the range."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

    ax.set_yscale("log")
    if high >= 10 * low:
        ax.yaxis.set_major_locator(LogLocator(numticks=6))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.0e}"))
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4, min_n_ticks=2))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.3g}"))
    ax.yaxis.set_minor_locator(NullLocator())


def draw_lines(
    ax: Axes,
    x: np.ndarray[Any, Any],
    series: dict[str, np.ndarray[Any, Any]],
    *,
    title: str,
    ylabel: str,
    log: bool = False,
) -> None:
    """Draw one line per named series on `ax`; a legend when there are few, colour by order when many.

    With `log`, values <= 0 are left out (a gap). A panel with nothing to draw says why instead of staying blank.
    """
    from matplotlib import colormaps

    if len(series) <= 10:  # few lines: distinct colours, named in the legend
        colours = colormaps["tab10"](np.arange(max(len(series), 1)))
    else:  # many: dark to light in model order
        colours = colormaps["viridis"](np.linspace(0.0, 0.9, len(series)))
    drawn = {name: np.where(values > 0, values, np.nan) if log else values for name, values in series.items()}
    lines = {}
    for (name, shown), colour in zip(drawn.items(), colours, strict=False):
        marker = "." if np.count_nonzero(np.isfinite(shown)) < 40 else None  # lone points stay visible
        (lines[name],) = ax.plot(
            x[: len(shown)], shown, label=label(name), color=colour, linewidth=1.2, marker=marker, markersize=4
        )
    finite = np.concatenate([v[np.isfinite(v)] for v in drawn.values()]) if drawn else np.zeros(0)
    few_ticks(ax)
    if log and finite.size:
        _log_axis(ax, float(finite.min()), float(finite.max()))
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if not series:
        ax.text(0.5, 0.5, "nothing recorded", ha="center", va="center", transform=ax.transAxes)
    elif not finite.size:
        message = "no value > 0 to draw on a log scale" if log and _any_finite(series) else NO_FINITE
        ax.text(0.5, 0.5, message, ha="center", va="center", color="crimson", transform=ax.transAxes)
    if series and len(series) <= MAX_LEGEND:
        ax.legend(fontsize="x-small", loc="best", framealpha=0.6)
    elif series:
        named = extremes(drawn)
        handles = [lines[name] for name in named.values()]
        for handle in handles:
            handle.set_linewidth(2.2)
        labels = [f"{label(name, LABEL_WIDTH // 2)} ({role})" for role, name in named.items()]
        ax.legend(handles, labels, fontsize="x-small", loc="best", framealpha=0.6)
        ax.text(0.01, 0.99, f"{len(series)} series, dark = first", va="top", fontsize="small", transform=ax.transAxes)


def extremes(series: dict[str, np.ndarray[Any, Any]]) -> dict[str, str]:
    """The series a crowded panel names: the first and last (in the given order), and the highest and lowest at
    their last finite value, by role (a series already named keeps its first role)."""
    names = list(series)
    last = {name: values[np.isfinite(values)][-1] for name, values in series.items() if np.isfinite(values).any()}
    roles = {"first": names[0], "last": names[-1]}
    if last:
        roles["highest"] = max(last, key=lambda name: last[name])
        roles["lowest"] = min(last, key=lambda name: last[name])
    chosen: dict[str, str] = {}
    for role, name in roles.items():
        if name not in chosen.values():
            chosen[role] = name
    return chosen


NO_FINITE = "no finite values: NaN/Inf, or never observed"


def _any_finite(series: dict[str, np.ndarray[Any, Any]]) -> bool:
    return any(np.isfinite(values).any() for values in series.values())


def nonfinite_note(ax: Axes, x: np.ndarray[Any, Any], counts: Any, what: str) -> None:
    """Say on `ax` at how many steps `counts` (non-finite values per step) is above zero, and from which step."""
    if counts is None:
        return
    values = np.nan_to_num(as_array(counts), nan=0.0)
    bad = np.flatnonzero(values > 0)
    if bad.size:
        first = int(x[bad[0]]) if bad[0] < len(x) else int(bad[0])
        note = f"non-finite {what} at {bad.size} steps, from step {first}"
        ax.text(0.01, 0.01, note, color="crimson", fontsize="small", va="bottom", transform=ax.transAxes)
