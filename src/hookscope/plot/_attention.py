"""Per-head heatmaps of `WatchResults.attention`: the max logit (log scale) and the entropy over steps."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._check import checked
from ..results._results import WatchResults
from ._base import as_array, few_ticks, new_figure, steps_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure
else:
    Figure = Any

__all__ = ["plot_attention"]


@checked()
def plot_attention(results: WatchResults, layers: Iterable[str] | None = None) -> Figure:
    """Draw, per attention module (rows) and head (image rows), the max logit (log10) and the entropy over steps.

    Raises:
        ValueError: No attention was recorded, or `layers` names a module without attention series.
    """
    recorded = list(results.attention)
    chosen = recorded if layers is None else list(layers)
    unknown = [p for p in chosen if p not in results.attention]
    if unknown:
        raise ValueError(
            f"layers must be attention modules of the results, got {unknown[:3]}; recorded: {recorded[:10]}"
        )
    if not chosen:
        raise ValueError("results.attention must hold series to plot them, got none (no attention was found)")
    figure, axes = new_figure(len(chosen), 2, (10, 1.2 + 1.1 * len(chosen)))
    x = steps_of(results)
    extent_x = (float(x[0]) if len(x) else 0.0, float(x[-1]) + 1 if len(x) else 1.0)
    for row, path in enumerate(chosen):
        stats = results.attention[path]
        logits = as_array(stats["max_logit"]).T  # (heads, S)
        with np.errstate(divide="ignore", invalid="ignore"):
            shown = np.log10(np.where(logits > 0, logits, np.nan))
        images = ((shown, "max logit (log10)", "magma"), (as_array(stats["entropy"]).T, "entropy (0-1)", "viridis"))
        for column, (image, title, colours) in enumerate(images):
            ax = axes[row][column]
            extent = (*extent_x, -0.5, image.shape[0] - 0.5)
            limits = {"vmin": 0.0, "vmax": 1.0} if column else {}
            drawn = ax.imshow(
                image, origin="lower", aspect="auto", interpolation="nearest", cmap=colours, extent=extent, **limits
            )
            figure.colorbar(drawn, ax=ax)
            ax.set_title(f"{path}: {title}", fontsize=9)
            ax.set_ylabel("head")
            few_ticks(ax)
        axes[row][0].set_xlabel("step")
        axes[row][1].set_xlabel("step")
    return figure
