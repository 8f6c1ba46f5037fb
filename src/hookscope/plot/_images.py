"""The two plots ActivationStats draws: the "colorful dimension" image and a layer's statistics over time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._check import FIGSIZE, FINITE, NON_NEGATIVE, checked
from ._base import as_array, axes_or_new, near_zero_caption, new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
else:  # matplotlib is imported when a plot is drawn: an axes argument is matplotlib's to check, not @checked's
    Axes = Figure = Any

__all__ = ["color_dim", "layer_stats"]

Series = torch.Tensor | Sequence[float] | np.ndarray[Any, Any]


@checked(figsize=FIGSIZE)
def color_dim(
    hist: torch.Tensor | np.ndarray[Any, Any], figsize: tuple[float, float] = (10, 5), ax: Axes | None = None
) -> Figure:
    """Draw the "colorful dimension" image of a histogram over time (fastai's `color_dim`).

    Args:
        hist: Shape (bins, records): one column per record, usually `log1p` of the counts (low values at the
            bottom, time to the right).
        figsize: The size of a new figure; ignored when `ax` is given.
        ax: Draw into these axes instead of a new figure.

    Returns:
        The figure drawn into.

    Raises:
        ValueError: `hist` is not 2-D.
    """
    image = as_array(hist)
    if image.ndim != 2:
        raise ValueError(f"hist must be 2-D (bins, records), got shape {tuple(image.shape)}; pass stats.hist(j)")
    figure, ax = axes_or_new(ax, figsize)
    ax.imshow(image, origin="lower", aspect="auto", interpolation="nearest", cmap="viridis")
    ax.axis("off")
    return figure


@checked(figsize=FIGSIZE, near_zero=(FINITE, NON_NEGATIVE))
def layer_stats(
    means: Series,
    stds: Series,
    near_zeros: Series,
    figsize: tuple[float, float] = (12, 3.5),
    title: str = "",
    near_zero: float | None = None,
) -> Figure:
    """Draw a layer's activation mean, std and % near zero over records, in three panels (fastai's layout).

    Args:
        means: (records,) mean of the layer's output per record.
        stds: (records,) standard deviation per record.
        near_zeros: (records,) fraction of output values near zero per record (drawn as a percentage).
        figsize: The size of the figure.
        title: A title over the three panels (e.g. the layer's path).
        near_zero: The threshold of ActivationStats' signed rule `x <= near_zero`, named in the third panel's
            title (`% x ≤ 0.05`); `None`: `% near zero`.

    Returns:
        A new figure with three axes.

    Raises:
        ValueError: The three series differ in length.
    """
    columns = [as_array(means), as_array(stds), as_array(near_zeros) * 100.0]
    if len({column.shape for column in columns}) != 1:
        shapes = [tuple(column.shape) for column in columns]
        raise ValueError(f"means, stds and near_zeros must have the same shape, got {shapes}")
    figure, axes = new_figure(1, 3, figsize)
    captions = ("mean", "std", near_zero_caption(near_zero, signed=True))
    for ax, values, name in zip(axes[0], columns, captions, strict=True):
        ax.plot(np.arange(len(values)), values)
        ax.set_title(name)
        ax.set_xlabel("record")
    if title:
        figure.suptitle(title)
    return figure
