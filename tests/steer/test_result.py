"""PatchResult: labels, the long table, the heatmap, the notebook HTML (escaped) and the short repr."""

from __future__ import annotations

import torch

from hookscope.steer import PatchResult


def _result() -> PatchResult:
    effects = torch.tensor([[0.1, 0.9, -0.2, 0.0], [float("nan"), 0.5, 0.25, 1.5]], dtype=torch.float64)
    return PatchResult(effects, ["blocks.0", "<img src=x onerror=alert(1)>\u202e"], [3, 7], [0, 1], at="input")


def test_cells_labels_grid_and_top() -> None:
    result = _result()
    assert result.cells == [(3, 0), (3, 1), (7, 0), (7, 1)]
    assert result.cell_labels() == ["pos 3 head 0", "pos 3 head 1", "pos 7 head 0", "pos 7 head 1"]
    assert torch.equal(result.grid("blocks.0"), torch.tensor([[0.1, 0.9], [-0.2, 0.0]], dtype=torch.float64))
    assert result.top(2) == [(result.sites[1], 7, 1, 1.5), ("blocks.0", 3, 1, 0.9)]
    whole = PatchResult(torch.ones(1, 1, dtype=torch.float64), ["h"], None, None)
    assert whole.cells == [(None, None)] and whole.cell_labels() == ["all"]


def test_to_dataframe_is_one_row_per_cell() -> None:
    frame = _result().to_dataframe()
    assert list(frame.columns) == ["site", "position", "head", "effect"] and len(frame) == 8
    row = frame.iloc[1]
    assert (row["site"], row["position"], row["head"], row["effect"]) == ("blocks.0", 3, 1, 0.9)


def test_plot_draws_one_heatmap_of_the_effects() -> None:
    figure = _result().plot()
    axes = figure.axes[0]
    image = axes.images[0]
    assert image.get_array().shape == (2, 4)
    assert [t.get_text() for t in axes.get_xticklabels()] == _result().cell_labels()


def test_repr_is_short_and_the_html_is_escaped() -> None:
    result = _result()
    assert repr(result) == (
        "PatchResult(activation, 2 sites x 4 cells, at='input', top '<img src=x onerror=alert(1)>\\u202e' "
        "pos 7 head 1 = 1.5)"
    )
    page = result._repr_html_()
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;&lt;U+202E&gt;" in page and "\u202e" not in page
    assert page.count("<tr>") == 3 and "title='nan'" in page
