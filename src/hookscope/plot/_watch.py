"""Plots of `WatchResults`: activations, gradient flow, update ratios, loss, histograms, one layer at a glance."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._check import FINITE, POSITIVE, checked
from .._errors import unknown_name
from ..results._activity import DEAD_UNIT_ACTIVITY, count_inactive_units
from ..results._results import WatchResults
from ._base import (
    as_array,
    axes_or_new,
    draw_lines,
    few_ticks,
    label,
    near_zero_caption,
    new_figure,
    nonfinite_note,
    steps_of,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
else:  # matplotlib is imported when a plot is drawn: an axes argument is matplotlib's to check, not @checked's
    Axes = Figure = Any

__all__ = [
    "UPDATE_RATIO_GUIDE",
    "in_model_order",
    "params_of",
    "plot_activations",
    "plot_gradient_flow",
    "plot_histogram",
    "plot_layer",
    "plot_loss",
    "plot_unit_activity",
    "plot_update_ratios",
]

UPDATE_RATIO_GUIDE = 1e-3
"""The rule-of-thumb update-to-weight ratio (Karpathy): far above it the learning rate is too high, far below it
too low."""


def _pick(results: WatchResults, names: Iterable[str], chosen: Iterable[str] | None, argument: str) -> list[str]:
    available = in_model_order(results, names)
    if chosen is None:
        return available
    picked = list(chosen)
    unknown = [name for name in picked if name not in available]
    if unknown:
        raise ValueError(f"{argument} must name recorded series, got {unknown[0]!r}; recorded: {available[:10]}")
    return picked


def in_model_order(results: WatchResults, names: Iterable[str]) -> list[str]:
    """Return module paths or parameter names sorted by their module's place in `results.layers` (model order)."""
    position = {path: index for index, path in enumerate(results.layers)}
    ranked = [(position.get(name, position.get(name.rpartition(".")[0], len(position))), name) for name in names]
    return [name for _, name in sorted(ranked, key=lambda pair: pair[0])]


@checked()
def params_of(results: WatchResults, path: str) -> list[str]:
    """Return the parameter names recorded in `results` that belong directly to the module at `path`.

    Raises:
        ValueError: `path` is not a layer of `results`.
    """
    if path not in results.layers:
        raise ValueError(unknown_name("path", path, results.layers, what="layer path"))
    names = dict.fromkeys([*results.param_grads, *results.update_ratios])
    return sorted(name for name in names if name.rpartition(".")[0] == path)


@checked()
def plot_activations(results: WatchResults, layers: Iterable[str] | None = None) -> Figure:
    """Draw each layer's output mean, std and % near zero (`|x| <= results.meta["near_zero"]`) over steps, one line
    per layer, in three panels.

    Raises:
        ValueError: A name in `layers` was not recorded.
    """
    picked = _pick(results, results.activations, layers, "layers")
    figure, axes = new_figure(1, 3, (14, 4))
    x = steps_of(results)
    near = near_zero_caption(results.meta.get("near_zero"))
    for ax, stat, caption, scale in zip(
        axes[0], ("mean", "std", "near_zero"), ("mean", "std", near), (1.0, 1.0, 100.0), strict=True
    ):
        series = {p: as_array(results.activations[p][stat]) * scale for p in picked if stat in results.activations[p]}
        draw_lines(ax, x, series, title=f"activation {caption}", ylabel=caption)
    return figure


@checked()
def plot_gradient_flow(results: WatchResults, layers: Iterable[str] | None = None, *, source: str = "output") -> Figure:
    """Draw gradient L2 norms per layer over steps on a log scale (gradient flow).

    Args:
        results: What `watch()` collected.
        layers: Module paths (source `"output"`) or parameter names (source `"param"`); default all.
        source: `"output"` for d loss / d module output, `"param"` for parameter gradients.

    Raises:
        ValueError: `source` is neither, or a name in `layers` was not recorded.
    """
    if source not in ("output", "param"):
        raise ValueError(f"source must be 'output' or 'param', got {source!r}")
    table = results.output_grads if source == "output" else results.param_grads
    picked = _pick(results, table, layers, "layers")
    figure, axes = new_figure(1, 1, (9, 4.5))
    series = {name: as_array(table[name]["norm"]) for name in picked if "norm" in table[name]}
    draw_lines(axes[0][0], steps_of(results), series, title=f"gradient norm ({source})", ylabel="L2 norm", log=True)
    return figure


@checked(guide=(POSITIVE, FINITE))
def plot_update_ratios(
    results: WatchResults, params: Iterable[str] | None = None, *, guide: float = UPDATE_RATIO_GUIDE
) -> Figure:
    """Draw update-to-weight ratios ||dW|| / ||W|| per parameter over steps, log scale, with the `guide` line.

    Raises:
        ValueError: A name in `params` was not recorded.
    """
    picked = _pick(results, results.update_ratios, params, "params")
    figure, axes = new_figure(1, 1, (9, 4.5))
    ax = axes[0][0]
    series = {name: as_array(results.update_ratios[name]) for name in picked}
    draw_lines(ax, steps_of(results), series, title="update / weight ratio", ylabel="||dW|| / ||W||", log=True)
    _guide_line(ax, guide)
    return figure


def _guide_line(ax: Axes, guide: float) -> None:
    ax.axhline(guide, color="crimson", linestyle="--", linewidth=1.0)
    transform = ax.get_yaxis_transform()
    ax.text(0.99, guide, f"{guide:g}", color="crimson", ha="right", va="bottom", transform=transform, clip_on=True)


@checked()
def plot_loss(results: WatchResults) -> Figure:
    """Draw the logged loss over steps (log scale when it stays positive): every logged step's, when the run
    measured fewer steps than it logged (`WatchResults.loss_series`).

    Raises:
        ValueError: No loss was logged.
    """
    series = results.loss_series()
    if series is None:
        raise ValueError("results.losses must be logged to plot it, got None; call w.log_loss(loss) each step")
    figure, axes = new_figure(1, 1, (9, 4))
    steps, values = as_array(series[0]), as_array(series[1])
    positive = bool(np.all(values[np.isfinite(values)] > 0))
    draw_lines(axes[0][0], steps, {"loss": values}, title="loss", ylabel="loss", log=positive)
    return figure


@checked()
def plot_histogram(results: WatchResults, layer: str, ax: Axes | None = None) -> Figure:
    """Draw a layer's output histogram over steps as an image (log1p counts; value on y, step on x).

    Raises:
        ValueError: No histogram was recorded for `layer`.
    """
    if layer not in results.histograms:
        raise ValueError(
            f"layer must have a recorded histogram, got {layer!r}; recorded: {list(results.histograms)[:10]}"
        )
    image = np.log1p(as_array(results.histograms[layer]).T)  # (bins, S)
    edges = as_array(results.hist_edges[layer]) if layer in results.hist_edges else np.arange(image.shape[0] + 1.0)
    x = steps_of(results)
    figure, ax = axes_or_new(ax, (9, 4))
    extent = (float(x[0]) if len(x) else 0.0, float(x[-1]) + 1 if len(x) else 1.0, float(edges[0]), float(edges[-1]))
    ax.imshow(image, origin="lower", aspect="auto", interpolation="nearest", cmap="viridis", extent=extent)
    few_ticks(ax)
    ax.set_title("output histogram (log1p counts)")
    ax.set_xlabel("step")
    ax.set_ylabel("value")
    return figure


@checked()
def plot_unit_activity(results: WatchResults, layer: str, ax: Axes | None = None) -> Figure:
    """Draw the fraction of positive outputs of each unit of `layer`, sorted; the title counts the units active
    less than `DEAD_UNIT_ACTIVITY` of the time (dead, as the doctor counts them) and those never active.

    Raises:
        ValueError: No unit activity was recorded for `layer`.
    """
    if layer not in results.unit_activity:
        raise ValueError(f"layer must have recorded unit activity, got {layer!r}")
    activity = np.sort(as_array(results.unit_activity[layer]))
    counts = count_inactive_units(results.unit_activity[layer])
    figure, ax = axes_or_new(ax, (6, 3.5))
    ax.stairs(activity, np.arange(len(activity) + 1.0), fill=True, color="teal")  # one artist, not one per unit
    ax.axhline(DEAD_UNIT_ACTIVITY, color="crimson", linestyle="--", linewidth=1.0)
    ax.set_title(
        f"units: {counts.inactive} of {counts.units} active < {DEAD_UNIT_ACTIVITY:.0%} ({counts.never} never)",
        fontsize="medium",
    )
    few_ticks(ax)
    ax.set_xlabel("unit (sorted)")
    ax.set_ylabel("fraction > 0")
    ax.set_ylim(0, 1.05)
    return figure


@checked()
def plot_layer(results: WatchResults, path: str) -> Figure:
    """Draw one layer at a glance: activation mean/std, % near zero, gradient norms, update ratios, histogram and
    unit activity (a panel with nothing recorded says so).

    Raises:
        ValueError: `path` is not a layer of `results`.
    """
    if path not in results.layers and path not in results.activations:
        raise ValueError(f"path must name a watched layer, got {path!r}; layers: {list(results.layers)[:10]}")
    figure, axes = new_figure(2, 3, (15, 7.5))
    x = steps_of(results)
    stats = results.activations.get(path, {})
    moments: dict[str, np.ndarray[Any, Any]] = {
        name: as_array(stats[name]) for name in ("mean", "std") if name in stats
    }
    draw_lines(axes[0][0], x, moments, title="activation mean / std", ylabel="value")
    nonfinite_note(axes[0][0], x, stats.get("nonfinite"), "outputs")
    caption = near_zero_caption(results.meta.get("near_zero"))
    near = {caption: as_array(stats["near_zero"]) * 100.0} if "near_zero" in stats else {}
    draw_lines(axes[0][1], x, near, title=caption, ylabel="%")
    _layer_gradients(axes[0][2], results, path, x)
    params = [name for name in params_of(results, path) if name in results.update_ratios]
    ratios = {name: as_array(results.update_ratios[name]) for name in params}
    _optional(axes[1][0], bool(ratios), lambda ax: _layer_ratios(ax, x, ratios), NO_RATIOS)
    _optional(axes[1][1], path in results.histograms, lambda ax: plot_histogram(results, path, ax), NO_HISTOGRAM)
    _optional(axes[1][2], path in results.unit_activity, lambda ax: plot_unit_activity(results, path, ax), NO_UNITS)
    figure.suptitle(f"{label(path)} ({label(results.layers.get(path, '?'))})")
    return figure


def _layer_ratios(ax: Axes, x: np.ndarray[Any, Any], ratios: dict[str, np.ndarray[Any, Any]]) -> None:
    shown = {name.rpartition(".")[2]: values for name, values in ratios.items()}
    draw_lines(ax, x, shown, title="update / weight ratio", ylabel="||dW|| / ||W||", log=True)
    _guide_line(ax, UPDATE_RATIO_GUIDE)


def _layer_gradients(ax: Axes, results: WatchResults, path: str, x: np.ndarray[Any, Any]) -> None:
    series = {}
    if "norm" in results.output_grads.get(path, {}):
        series["output grad"] = as_array(results.output_grads[path]["norm"])
    for name in params_of(results, path):
        if "norm" in results.param_grads.get(name, {}):
            series[f"{name.rpartition('.')[2]} grad"] = as_array(results.param_grads[name]["norm"])
    draw_lines(ax, x, series, title="gradient norm", ylabel="L2 norm", log=True)
    nonfinite_note(ax, x, results.output_grads.get(path, {}).get("nonfinite"), "gradients")


NO_RATIOS = "no update ratio recorded\n(no parameters of its own, or no optimizer)"
NO_HISTOGRAM = "no histogram recorded"
NO_UNITS = "no unit activity recorded"


def _optional(ax: Axes, present: bool, draw: Any, message: str) -> None:
    if present:
        draw(ax)
    else:
        ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
