"""Plots: matplotlib figures drawn from results (never from live monitors), matplotlib imported lazily.

`_images.py` holds the two plots `ActivationStats` draws (`color_dim`, `layer_stats`); `_watch.py` draws
`WatchResults`: activations per layer over steps, gradient flow, update-to-weight ratios against the 1e-3
guide line, loss, output histograms, unit activity and one layer at a glance (`plot_layer`); `_weights.py` draws
weight distributions; `_attention.py` draws per-head heatmaps of attention (max logit and entropy over steps).
Every function returns a `matplotlib.figure.Figure` created without pyplot (Agg canvas, no global figure registry,
nothing to close, no window), so it works headless and in notebooks alike, where it shows once as a PNG
(`_figure.NotebookFigure`); `report` embeds them.
matplotlib is needed only when a function is called (`pip install matplotlib`).
"""

from ._attention import plot_attention
from ._watch import (
    plot_activations,
    plot_gradient_flow,
    plot_histogram,
    plot_layer,
    plot_loss,
    plot_unit_activity,
    plot_update_ratios,
)
from ._weights import plot_weights

__all__ = [
    "plot_activations",
    "plot_attention",
    "plot_gradient_flow",
    "plot_histogram",
    "plot_layer",
    "plot_loss",
    "plot_unit_activity",
    "plot_update_ratios",
    "plot_weights",
]
