"""What a notebook shows, checked without a kernel: short reprs, escaped HTML (hostile layer names stay inert),
the small SVG charts, findings coloured by severity, and figures that show as one PNG and never open a window."""

from __future__ import annotations

import doctest
import importlib
import math
import re

import pytest
import torch
import torch.nn as nn

from hookscope.doctor import Finding, Findings
from hookscope.doctor._finding import SEVERITY_COLORS, findings_html
from hookscope.results import WatchResults
from hookscope.summary import summary

HOSTILE = "<img src=x onerror=alert(1)>\u202e"
"""A layer name that would run script in an unescaped page, with a bidi override (RELIABILITY.md H2)."""


def hostile_results() -> WatchResults:
    results = WatchResults(steps=torch.arange(3), layers={HOSTILE: "Linear", "head": "Linear"})
    for path in results.layers:
        results.activations[path] = {"mean": torch.tensor([0.5, math.nan, 0.25], dtype=torch.float64)}
        results.output_grads[path] = {"norm": torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)}
    results.losses = torch.tensor([2.0, 1.0, 0.5], dtype=torch.float64)
    results.unobserved["head"] = "never ran"
    return results


def assert_inert(html: str) -> None:
    assert "<img" not in html and "<script" not in html and "\u202e" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;&lt;U+202E&gt;" in html


def test_results_show_a_short_repr_and_an_escaped_table() -> None:
    results = hostile_results()
    assert repr(results) == "WatchResults(3 recorded steps (0..2), 2 layers, loss 2 -> 0.5)"
    html = results._repr_html_()
    assert_inert(html)
    assert html.count("<svg") == 2 * 2 + 1  # mean and grad norm of 2 layers (no std recorded), and the loss
    assert "unobserved: head: never ran" in html
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", html)
    assert cells[:6] == ["&lt;img src=x onerror=alert(1)&gt;&lt;U+202E&gt;", "Linear", "0.25", "nan", "3", "nan"]


def test_a_summary_shows_a_short_repr_and_an_escaped_table() -> None:
    model = nn.ModuleDict({HOSTILE: nn.Linear(2, 3)})
    shown = summary(model)
    assert repr(shown) == "ModelSummary(ModuleDict: 2 modules, 9 params; print() it for the table)"
    html = shown._repr_html_()
    assert_inert(html)
    assert "Total params: 9" in html and str(shown).count("\n") > 5  # print() is still the whole table


def test_findings_are_a_list_shown_coloured_by_severity() -> None:
    findings = Findings(
        [
            Finding("dead_units", "error", HOSTILE, 3, "dead <b>", {"fraction": 0.5}, "Lower the lr."),
            Finding("lr_too_low", "info", None, None, "slow", {}, ""),
        ]
    )
    assert findings == list(findings) and isinstance(findings[:1], list) and len(findings) == 2
    html = findings._repr_html_()
    assert_inert(html)
    assert html.index(SEVERITY_COLORS["error"]) < html.index(SEVERITY_COLORS["info"])
    assert "2 findings (1 error, 1 info)" in html and "fraction = 0.5" in html and "-&gt; Lower the lr." in html
    assert "1 more" in findings_html(findings, limit=1)
    assert "no findings." in findings_html([])
    with pytest.raises(ValueError, match="limit must be a positive int or None, got 0"):
        findings_html(findings, limit=0)


def test_diagnose_returns_findings() -> None:
    from hookscope.doctor import diagnose

    results = WatchResults(steps=torch.arange(3), layers={"1": "ReLU"}, unit_activity={"1": torch.zeros(4)})
    found = diagnose(results)
    assert isinstance(found, Findings) and [f.check for f in found] == ["dead_units"]


def test_a_sparkline_draws_each_value_where_it_belongs() -> None:
    from hookscope._html import sparkline

    svg = sparkline([1.0, 3.0, math.nan, 2.0, math.inf, 0.0, 5.0], width=64, height=20)
    runs = re.findall(r'points="([^"]*)"', svg)
    assert len(runs) == 2 and svg.count("<circle") == 1  # [1, 3], a lone 2 between gaps, [0, 5]
    points = [tuple(map(float, p.split(","))) for run in runs for p in run.split()]
    assert [y for _, y in points] == [pytest.approx(18 - v / 5 * 16) for v in (1, 3, 0, 5)]  # 0 at the bottom
    assert [x for x, _ in points] == pytest.approx([2 + i * 10 for i in (0, 1, 5, 6)])
    assert "no finite values" in sparkline([math.nan, math.inf])


def test_a_long_series_is_drawn_small() -> None:
    from hookscope._html import sparkline

    values = [float(i % 7) for i in range(100_000)]
    values[50_000:60_000] = [math.nan] * 10_000  # a stretch never observed: a gap
    svg = sparkline(values, width=100)
    runs = re.findall(r'points="([^"]*)"', svg)
    assert len(runs) == 2 and sum(len(run.split()) for run in runs) == 100 - 10 and len(svg) < 4000
    assert "min 0, max 6, 100000 steps" in svg  # the tooltip reads every value


@pytest.mark.parametrize("module", ["hookscope._html", "hookscope.summary._html", "hookscope.results._display"])
def test_the_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


def test_a_figure_shows_as_one_png_and_pyplot_never_sees_it() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from hookscope.plot import plot_loss

    before = plt.get_fignums()
    figure = plot_loss(hostile_results())
    assert figure._repr_png_().startswith(b"\x89PNG\r\n\x1a\n")
    assert plt.get_fignums() == before  # pyplot does not track it: no window, no second drawing at cell end
