"""Each plot of WatchResults draws exactly the recorded series, in model order, with hostile names inert."""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from hookscope.doctor import diagnose
from hookscope.plot import (
    plot_activations,
    plot_gradient_flow,
    plot_histogram,
    plot_layer,
    plot_loss,
    plot_unit_activity,
    plot_update_ratios,
    plot_weights,
)
from hookscope.plot._images import layer_stats
from hookscope.plot._watch import UPDATE_RATIO_GUIDE
from hookscope.plot._weights import weight_histograms
from hookscope.results import WatchResults
from stats_oracle import auto_exponent, auto_histogram, values_of


def lines_by_label(ax) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    return {line.get_label(): np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()}


def test_activations_panels_hold_each_layers_series(results: WatchResults) -> None:
    figure = plot_activations(results)
    mean_ax, std_ax, near_ax = figure.axes
    for path in ("0", "2"):
        np.testing.assert_allclose(lines_by_label(mean_ax)[path], results.activations[path]["mean"].numpy())
        np.testing.assert_allclose(lines_by_label(std_ax)[path], results.activations[path]["std"].numpy())
        np.testing.assert_allclose(
            lines_by_label(near_ax)[path], results.activations[path]["near_zero"].numpy() * 100, rtol=1e-6
        )


def test_gradient_flow_is_log_scaled_per_layer_and_per_parameter(results: WatchResults) -> None:
    ax = plot_gradient_flow(results).axes[0]
    assert ax.get_yscale() == "log"
    np.testing.assert_allclose(lines_by_label(ax)["2"], results.output_grads["2"]["norm"].numpy(), rtol=1e-6)
    by_param = lines_by_label(plot_gradient_flow(results, source="param").axes[0])
    np.testing.assert_allclose(by_param["0.weight"], results.param_grads["0.weight"]["norm"].numpy(), rtol=1e-6)


def test_gradient_flow_rejects_unknown_source_and_layer(results: WatchResults) -> None:
    with pytest.raises(ValueError, match=r"source must be 'output' or 'param', got 'input'"):
        plot_gradient_flow(results, source="input")
    with pytest.raises(ValueError, match=r"layers must name recorded series, got 'nope'"):
        plot_gradient_flow(results, ["nope"])


def test_update_ratios_draw_the_guide_line(results: WatchResults) -> None:
    ax = plot_update_ratios(results).axes[0]
    lines = lines_by_label(ax)
    np.testing.assert_allclose(lines["2.weight"], results.update_ratios["2.weight"].numpy(), rtol=1e-6)
    guides = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(guides) == 1 and list(guides[0].get_ydata()) == [UPDATE_RATIO_GUIDE, UPDATE_RATIO_GUIDE]
    with pytest.raises(ValueError, match=r"params must name recorded series, got 'x.bias'"):
        plot_update_ratios(results, ["x.bias"])


def test_loss_is_drawn_or_asked_for(results: WatchResults) -> None:
    np.testing.assert_allclose(lines_by_label(plot_loss(results).axes[0])["loss"], results.losses.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match=r"results.losses must be logged to plot it, got None"):
        plot_loss(WatchResults())


def test_the_loss_of_every_logged_step_is_drawn_when_fewer_steps_were_measured() -> None:
    every = torch.arange(50)
    losses = 1.0 / (1.0 + every.double())
    measured = every[::10].clone()
    results = WatchResults(steps=measured, losses=losses[measured], logged_steps=every, logged_losses=losses)
    (line,) = [line for line in plot_loss(results).axes[0].get_lines() if line.get_label() == "loss"]
    np.testing.assert_array_equal(np.asarray(line.get_xdata(), dtype=float), every.numpy())
    np.testing.assert_allclose(np.asarray(line.get_ydata(), dtype=float), losses.numpy())


def test_non_finite_values_are_gaps(make_results: Callable[..., WatchResults]) -> None:
    results = make_results()
    results.activations["0"]["mean"][2] = float("inf")
    drawn = lines_by_label(plot_activations(results).axes[0])["0"]
    assert np.isnan(drawn[2]) and np.isfinite(np.delete(drawn, 2)).all()


def test_histogram_image_is_log1p_counts_with_value_on_y(results: WatchResults) -> None:
    (image,) = plot_histogram(results, "0").axes[0].get_images()
    np.testing.assert_allclose(image.get_array(), np.log1p(results.histograms["0"].numpy().T), rtol=1e-6)
    assert image.get_extent()[2:] == [-1.0, 1.0]
    with pytest.raises(ValueError, match=r"layer must have a recorded histogram, got 'nope'"):
        plot_histogram(results, "nope")


def test_unit_activity_counts_dead_units(results: WatchResults) -> None:
    ax = plot_unit_activity(results, "0").axes[0]
    (bars,) = ax.patches
    assert bars.get_data().values.tolist() == [0.0, 0.25, 0.5, 1.0]  # sorted activity, one step per unit
    assert ax.get_title() == "units: 1 of 4 active < 1% (1 never)"


def test_unit_activity_counts_mostly_dead_units_as_the_doctor_does(results: WatchResults) -> None:
    activity = torch.tensor([0.0, 0.004, 0.009, 0.0099, 0.01, 0.3, float("nan"), 0.0])
    results.layers["1"] = "ReLU"
    results.unit_activity = {"1": activity}
    (found,) = [f for f in diagnose(results, disable=["unobserved"]) if f.check == "dead_units"]
    inactive = int((activity[activity.isfinite()] < 0.01).sum())  # 5 of 7 observed units, 2 of them never
    assert (found.evidence["dead"], found.evidence["units"], found.evidence["never"]) == (inactive, 7, 2)
    title = plot_unit_activity(results, "1").axes[0].get_title()
    assert title == f"units: {inactive} of 7 active < 1% (2 never)"
    with pytest.raises(ValueError, match=r"layer must have recorded unit activity, got 'nope'"):
        plot_unit_activity(results, "nope")


def test_layer_figure_has_six_panels_and_says_what_is_missing(results: WatchResults) -> None:
    del results.histograms["2"]
    figure = plot_layer(results, "2")
    assert len(figure.axes) == 6
    assert any(t.get_text() == "no histogram recorded" for ax in figure.axes for t in ax.texts)
    np.testing.assert_allclose(lines_by_label(figure.axes[2])["output grad"], results.output_grads["2"]["norm"].numpy())
    with pytest.raises(ValueError, match=r"path must name a watched layer, got 'nope'"):
        plot_layer(results, "nope")


def test_weight_histograms_are_the_engines_and_match_the_oracle() -> None:
    values = torch.randn(1000)
    values[3] = float("nan")
    counts, edges = weight_histograms({"w": values}, bins=10)["w"]
    exponent = auto_exponent(values_of(values))
    assert exponent is not None and float(edges[-1]) == -float(edges[0]) == 2.0**exponent
    assert counts.tolist() == auto_histogram(values_of(values), 10, exponent).tolist()
    model = torch.nn.Linear(3, 2)
    assert list(weight_histograms(model)) == ["weight", "bias"]
    assert len(plot_weights(model).axes[0].patches) == 1
    with pytest.raises(ValueError, match=r"bins must be a positive even int .*, got 0"):
        weight_histograms(model, bins=0)


def test_hostile_names_render_literally_without_warnings(
    tmp_path: Path, make_results: Callable[..., WatchResults]
) -> None:
    names = ("<img src=x onerror=alert(1)>", "price$in$dollars", "a\u202eb", "")
    results = make_results(layers=names)
    path = results.save(tmp_path / "r.safetensors")
    loaded = WatchResults.load(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figure = plot_activations(loaded)
        figure.savefig(io.BytesIO(), format="png", dpi=30)
        plot_layer(loaded, "a\u202eb").savefig(io.BytesIO(), format="png", dpi=30)
    labels = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert labels == ["<img src=x onerror=alert(1)>", r"price\$in\$dollars", "a<U+202E>b", "(root)"]


def test_non_finite_outputs_are_called_out(make_results: Callable[..., WatchResults]) -> None:
    results = make_results(layers=("0",))
    nan = float("nan")
    results.activations["0"]["nonfinite"] = torch.tensor([0.0, 0.0, 12.0, 40.0, nan, 3.0])  # NaN: not observed
    results.output_grads["0"]["norm"][:] = nan
    results.param_grads["0.weight"]["norm"][:] = nan
    figure = plot_layer(results, "0")
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert "non-finite outputs at 3 steps, from step 2" in texts
    assert "no finite values: NaN/Inf, or never observed" in [t.get_text() for t in figure.axes[2].texts]
    results.losses[:] = nan
    assert [t.get_text() for t in plot_loss(results).axes[0].texts] == ["no finite values: NaN/Inf, or never observed"]
    weights = plot_weights({"w": torch.full((4,), nan)})
    assert [t.get_text() for t in weights.axes[0].texts] == ["no finite values"]


def test_a_lone_finite_point_is_drawn_with_a_marker(make_results: Callable[..., WatchResults]) -> None:
    results = make_results(layers=("0",))
    results.activations["0"]["mean"][1:] = float("nan")
    (line, *_) = plot_activations(results).axes[0].get_lines()
    assert line.get_marker() == "."


def test_a_loss_spanning_less_than_a_decade_has_labelled_y_ticks(results: WatchResults) -> None:
    results.losses = torch.linspace(2.3, 1.9, results.num_steps)  # log scale, no power of ten inside
    ax = plot_loss(results).axes[0]
    ax.figure.canvas.draw()
    low, high = ax.get_ylim()
    labels = [(t.get_position()[1], t.get_text()) for t in ax.get_yticklabels() if t.get_text()]
    inside = [(y, text) for y, text in labels if low <= y <= high]
    assert ax.get_yscale() == "log" and len(inside) >= 2, labels
    assert all(float(text) == pytest.approx(y, rel=1e-2) for y, text in inside)  # the label says the value


def test_near_zero_captions_name_the_rule_and_the_recorded_threshold(results: WatchResults) -> None:
    assert plot_activations(results).axes[2].get_title() == "activation % near zero"  # threshold unknown
    results.meta["near_zero"] = 1e-3
    assert plot_activations(results).axes[2].get_title() == "activation % |x| ≤ 1e-3"
    results.meta["near_zero"] = 0.02
    assert plot_layer(results, "0").axes[1].get_title() == "% |x| ≤ 0.02"
    fastai = layer_stats(torch.zeros(3), torch.ones(3), torch.full((3,), 0.5), near_zero=0.05)
    assert [ax.get_title() for ax in fastai.axes] == ["mean", "std", "% x ≤ 0.05"]


def test_no_panel_of_a_layer_figure_is_blank(results: WatchResults) -> None:
    results.layers["1"] = "ReLU"  # no parameters, no histogram, no units: every panel still says something
    results.activations["1"] = {"mean": torch.zeros(6), "std": torch.ones(6), "near_zero": torch.zeros(6)}
    results.update_ratios["2.weight"] = torch.zeros(6)  # frozen: nothing > 0 to draw on a log axis
    for path in ("1", "2"):
        for ax in plot_layer(results, path).axes:
            drawn = any(np.isfinite(np.asarray(line.get_ydata(), dtype=float)).any() for line in ax.get_lines())
            drawn = drawn or bool(ax.get_images()) or bool(ax.patches)
            assert drawn or [t.get_text() for t in ax.texts], (path, ax.get_title())
    (ratios,) = [ax for ax in plot_layer(results, "2").axes if ax.get_title() == "update / weight ratio"]
    assert [t.get_text() for t in ratios.texts if "log scale" in t.get_text()] == [
        "no value > 0 to draw on a log scale"
    ]


def test_a_crowded_panel_names_its_first_last_highest_and_lowest_series() -> None:
    # nanoGPT's overview: 18-29 lines per panel, which a legend of all of them would bury
    layers = {f"h.{i}.mlp": "Linear" for i in range(20)}
    finals = [5.0, 3.0, 9.0, 1.0] + [2.0 + 0.01 * i for i in range(16)]  # h.2 ends highest, h.3 lowest
    results = WatchResults(steps=torch.arange(3), layers=layers)
    for path, final in zip(layers, finals, strict=True):
        results.output_grads[path] = {"norm": torch.tensor([1.0, 2.0, final])}
    figure = plot_gradient_flow(results)
    ax = figure.axes[0]
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels == ["h.0.mlp (first)", "h.19.mlp (last)", "h.2.mlp (highest)", "h.3.mlp (lowest)"]
    assert len(ax.get_lines()) == 20  # every series is still drawn
    widths = {line.get_label(): line.get_linewidth() for line in ax.get_lines()}
    assert {name for name, width in widths.items() if width > 2} == {"h.0.mlp", "h.19.mlp", "h.2.mlp", "h.3.mlp"}
