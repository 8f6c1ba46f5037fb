"""Names in the report: shortened for the page and its plots, whole in the data; hostile ones never crash it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import torch

from hookscope.plot import plot_activations, plot_layer
from hookscope.plot._base import LABEL_WIDTH
from hookscope.report import render_report, write_report
from hookscope.report._data import RESULTS_FILE
from hookscope.report._html import NAME_WIDTH
from hookscope.results import WatchResults

SURROGATE = "block\ud800.fc"
LONG = "encoder." + "x" * 20000 + ".12345.head"


def texts_of(figure) -> list[str]:  # type: ignore[no-untyped-def]
    found = [t.get_text() for t in figure.texts]
    for ax in figure.axes:
        found += [ax.get_title(), *(t.get_text() for t in ax.texts)]
        legend = ax.get_legend()
        if legend is not None:
            found += [t.get_text() for t in legend.get_texts()]
    return found


def test_a_lone_surrogate_in_a_layer_name_is_shown_and_kept(
    tmp_path: Path, make_results: Callable[..., WatchResults]
) -> None:
    results = make_results(layers=("0", SURROGATE))
    page = write_report(tmp_path / "r", results)  # raised UnicodeEncodeError while saving the data
    assert "block&lt;U+D800&gt;.fc" in page.read_text(encoding="utf-8")
    loaded = WatchResults.load(tmp_path / "r" / RESULTS_FILE)
    assert list(loaded.layers) == ["0", SURROGATE] and list(loaded.histograms) == ["0", SURROGATE]
    torch.testing.assert_close(loaded.activations[SURROGATE]["mean"], results.activations[SURROGATE]["mean"])
    assert render_report(tmp_path / "r").read_text(encoding="utf-8") == page.read_text(encoding="utf-8")


def test_a_surrogate_name_beside_one_that_looks_like_its_stored_key_round_trips(tmp_path: Path) -> None:
    names = ("a\ud800", "hookscope.renamed/0")  # the second is what the first is stored under (_io)
    results = WatchResults(steps=torch.arange(2), layers=dict.fromkeys(names, "Linear"))
    results.activations = {name: {"mean": torch.full((2,), float(i))} for i, name in enumerate(names)}
    loaded = WatchResults.load(results.save(tmp_path / "r.safetensors"))
    assert list(loaded.activations) == list(names)
    assert [float(loaded.activations[name]["mean"][0]) for name in names] == [0.0, 1.0]


def test_a_20000_character_name_is_shortened_on_the_page_and_in_plots_but_whole_in_the_data(
    tmp_path: Path, make_results: Callable[..., WatchResults]
) -> None:
    results = make_results(layers=("0", LONG))
    # matplotlib spent 14 s laying out the whole name: every text drawn is now at most LABEL_WIDTH long
    for figure in (plot_activations(results), plot_layer(results, LONG)):
        assert max(map(len, texts_of(figure))) <= LABEL_WIDTH + len(" (Linear)")
    page = write_report(tmp_path / "r", results).read_text(encoding="utf-8")
    heading = re.search(r"<h3 title='([^']*)'>([^<]*) <span", page.split("id='layer-1'")[1])
    assert heading is not None
    assert heading.group(1) == LONG and len(heading.group(2)) <= NAME_WIDTH  # whole in the tooltip only
    assert heading.group(2).startswith("encoder.") and heading.group(2).endswith("12345.head")  # number whole
    assert list(WatchResults.load(tmp_path / "r" / RESULTS_FILE).layers) == ["0", LONG]


def test_the_root_module_is_named_root_in_findings_headings_and_legends(
    tmp_path: Path, make_results: Callable[..., WatchResults]
) -> None:
    results = make_results(layers=("", "0"))
    finding = {"severity": "warning", "check": "bad_init", "path": "", "step": 0, "message": "m"}
    page = write_report(tmp_path / "r", results, findings=[finding]).read_text(encoding="utf-8")
    assert "layer (root) · step 0" in page
    assert "<h3 title=''>(root) <span" in page
    assert "''" not in re.sub(r"title=''", "", page)
    labels = [t.get_text() for t in plot_activations(results).axes[0].get_legend().get_texts()]
    assert labels == ["(root)", "0"]


def test_hostile_names_never_crash_the_report(tmp_path: Path, make_results: Callable[..., WatchResults]) -> None:
    names = ("\ud800", "a\udfffb.c", "\u202e" * 3)
    page = write_report(tmp_path / "r", make_results(layers=names)).read_text(encoding="utf-8")
    assert "<U+" not in page and page.count("&lt;U+") >= 5
    assert list(WatchResults.load(tmp_path / "r" / RESULTS_FILE).layers) == list(names)
