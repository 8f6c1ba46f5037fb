"""Weight distributions: histograms of each parameter (computed once, small enough to save) and their plot."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn as nn

from .._check import checked
from ..stats._histogram import auto_edges, check_bins, range_exponent
from ..stats._histogram import counts as hist_counts
from ._base import as_array, label, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MAX_WEIGHT_PANELS", "plot_weight_histograms", "plot_weights", "weight_histograms"]

MAX_WEIGHT_PANELS = 24
"""The most parameters one weights figure draws; the rest are counted in its title."""

Histograms = Mapping[str, tuple[torch.Tensor, torch.Tensor]]


@checked()
def weight_histograms(
    weights: nn.Module | Mapping[str, torch.Tensor], bins: int = 40
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Return `{name: (counts (bins,), edges (bins + 1,))}` of each floating-point parameter's finite values.

    The histograms are the engine's (`hookscope.stats`): `bins` equal bins over the symmetric power-of-two range
    just wider than the largest finite magnitude, the range every histogram of hookscope uses.

    Args:
        weights: A model (its `named_parameters()`) or a mapping name -> tensor (e.g. a state dict).
        bins: Number of bins (even).

    Raises:
        ValueError: `bins` is not a positive int.
    """
    check_bins("bins", bins, automatic=True)
    named = dict(weights.named_parameters()) if isinstance(weights, nn.Module) else dict(weights)
    out = {}
    for name, tensor in named.items():
        if not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        values = tensor.detach().reshape(-1).double()
        finite = torch.isfinite(values)
        exponent = range_exponent(values)
        counts = hist_counts(values, finite.double(), bins, exponent)[:bins].cpu()
        out[name] = (counts, auto_edges(int(exponent), bins))  # one sync per parameter, at report time only
    return out


@checked()
def plot_weights(weights: nn.Module | Mapping[str, torch.Tensor], bins: int = 40) -> Figure:
    """Draw the distribution of each parameter of a model (or of a name -> tensor mapping), one panel each."""
    return plot_weight_histograms(weight_histograms(weights, bins))


@checked()
def plot_weight_histograms(histograms: Histograms) -> Figure:
    """Draw histograms from `weight_histograms` (or loaded from a report), one panel per parameter.

    Raises:
        ValueError: a histogram's edges are not one more than its counts.
    """
    for name, (saved_counts, saved_edges) in histograms.items():
        if saved_edges.numel() != saved_counts.numel() + 1:
            raise ValueError(
                f"histograms[{name!r}] must hold (counts, edges) with one more edge than counts, got "
                f"{saved_counts.numel()} counts and {saved_edges.numel()} edges (use weight_histograms(model))"
            )
    names = list(histograms)[:MAX_WEIGHT_PANELS]
    columns = min(4, max(len(names), 1))
    rows = max(math.ceil(len(names) / columns), 1)
    figure, axes = new_figure(rows, columns, (3.6 * columns, 2.6 * rows))
    flat = [ax for row in axes for ax in row]
    for ax, name in zip(flat, names, strict=False):
        counts, edges = (as_array(t) for t in histograms[name])
        ax.stairs(counts, edges, fill=True, color="steelblue")
        ax.set_title(label(name), fontsize="small")
        if not np.nansum(counts):
            ax.text(0.5, 0.5, "no finite values", ha="center", va="center", color="crimson", transform=ax.transAxes)
    for ax in flat[len(names) :]:
        figure.delaxes(ax)  # the grid's unused places: no empty panel
    hidden = len(histograms) - len(names)
    figure.suptitle("weight distributions" + (f" ({hidden} more parameters not drawn)" if hidden else ""))
    return figure
