"""color_dim and layer_stats draw exactly the arrays they are given."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from hookscope.plot._images import color_dim, layer_stats


def test_color_dim_draws_the_histogram_with_low_bins_at_the_bottom() -> None:
    hist = torch.log1p(torch.arange(12, dtype=torch.float32).reshape(4, 3))  # (bins, records)
    figure = color_dim(hist)
    (image,) = figure.axes[0].get_images()
    np.testing.assert_allclose(image.get_array(), hist.numpy())
    assert image.origin == "lower"
    assert tuple(figure.get_size_inches()) == (10, 5)


def test_color_dim_draws_into_given_axes() -> None:
    from matplotlib.figure import Figure

    outer = Figure()
    ax = outer.subplots()
    assert color_dim(np.ones((5, 2)), ax=ax) is outer
    assert len(ax.get_images()) == 1


def test_color_dim_refuses_a_1d_histogram() -> None:
    with pytest.raises(ValueError, match=r"hist must be 2-D \(bins, records\), got shape \(4,\)"):
        color_dim(torch.ones(4))


def test_layer_stats_draws_mean_std_and_percent_near_zero() -> None:
    means, stds, near = [0.1, 0.2, 0.3], torch.tensor([1.0, 0.5, 0.25]), np.array([0.0, 0.5, 1.0])
    figure = layer_stats(means, stds, near, title="conv1")
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == ["mean", "std", "% near zero"]
    drawn = [ax.get_lines()[0].get_ydata() for ax in figure.axes]
    np.testing.assert_allclose(drawn[0], means)
    np.testing.assert_allclose(drawn[1], stds.numpy())
    np.testing.assert_allclose(drawn[2], near * 100)
    figure.savefig(io.BytesIO(), format="png", dpi=30)


def test_layer_stats_refuses_series_of_different_lengths() -> None:
    with pytest.raises(ValueError, match=r"means, stds and near_zeros must have the same shape"):
        layer_stats([1.0, 2.0], [1.0], [0.0, 0.0])
