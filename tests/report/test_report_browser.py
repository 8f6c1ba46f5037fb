"""The report in a real browser (headless Chromium over the DevTools pipe): sections render, no console errors, and
for each real model (tests/realmodels) no empty panel in any figure and no blank figure on screen."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookscope.doctor import diagnose
from hookscope.report import _html as html
from hookscope.report import write_report
from hookscope.report._html import MAX_LAYERS
from hookscope.results import WatchResults
from hookscope.summary import summary
from realmodels.zoo import MODELS, healthy

HOSTILE = "<img src=x onerror=alert(1)>"


def test_report_renders_in_chromium_without_errors(
    tmp_path: Path, browser: Any, make_results: Callable[..., WatchResults]
) -> None:
    results = make_results(layers=("0", HOSTILE, "rtl\u202eevil"))
    finding = {"severity": "warning", "check": "dead_units", "path": HOSTILE, "step": 2, "message": "4 of 4 dead"}
    meta = {"model": "</style><script>window.pwned = 1</script>", "status": "raised", "error": "RuntimeError"}
    page = write_report(tmp_path / "report", results, findings=[finding], meta=meta)
    session = browser.open(page.resolve().as_uri())
    sections = browser.evaluate(session, "[...document.querySelectorAll('body > section')].map(s => s.id)")
    assert sections == ["findings", "summary", "overview", "layers", "details"]
    headings = browser.evaluate(session, "[...document.querySelectorAll('h2')].map(h => h.textContent)")
    assert headings == ["Diagnosis", "Model summary", "Overview", "Layers", "Run details"]
    images = browser.evaluate(session, "[...document.images].map(i => i.complete && i.naturalWidth > 100)")
    assert images == [True] * (5 + 3)
    assert browser.evaluate(session, "document.querySelectorAll('script, img[src=x], svg').length") == 0
    assert browser.evaluate(session, "typeof window.pwned") == "undefined"
    text = browser.evaluate(session, "document.body.innerText")
    assert HOSTILE in text and "rtl<U+202E>evil" in text and "The run did not complete" in text
    layer_titles = browser.evaluate(session, "[...document.querySelectorAll('.layer h3')].map(h => h.textContent)")
    assert layer_titles == ["0 Linear", f"{HOSTILE} Linear", "rtl<U+202E>evil Linear"]
    shot = browser.screenshot(session, tmp_path / "report.png")
    assert shot.read_bytes().startswith(b"\x89PNG")
    print(f"screenshot: {shot}")
    assert browser.problems() == []


def test_the_browser_check_sees_console_errors_and_exceptions(tmp_path: Path, browser: Any) -> None:
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><p>x</p><script>console.error('planted'); missingFunction();</script>")
    browser.open(page.as_uri())
    problems = browser.problems()
    assert any("planted" in problem for problem in problems)
    assert any("missingFunction is not defined" in problem for problem in problems)


def panel_contents(figure: Any) -> list[str]:
    """The panels of `figure` that show nothing: no finite line, image, bar or message (their titles)."""
    empty = []
    for ax in figure.axes:
        lines = any(np.isfinite(np.asarray(line.get_ydata(), dtype=float)).any() for line in ax.get_lines())
        if not (lines or ax.get_images() or ax.patches or ax.collections or ax.texts):
            empty.append(ax.get_title() or "untitled")
    return empty


def blank(png: bytes) -> bool:
    """Whether a screenshot is blank: (nearly) one colour, or (nearly) no pixel off the background."""
    from matplotlib.image import imread

    pixels = imread(io.BytesIO(png), format="png")[..., :3]
    off_background = (np.abs(pixels - pixels[0, 0]).sum(-1) > 0.1).mean()
    return bool(pixels.std() < 0.02 or off_background < 0.005)


def test_the_blank_check_tells_a_blank_figure_from_a_drawn_one() -> None:
    from hookscope.plot._base import new_figure

    figure, axes = new_figure(1, 1, (4, 3))
    empty_png, drawn_png = io.BytesIO(), io.BytesIO()
    axes[0][0].set_axis_off()
    figure.savefig(empty_png, format="png")
    assert blank(empty_png.getvalue()) and panel_contents(figure) == ["untitled"]
    axes[0][0].plot([0, 1, 2], [1, 3, 2])
    figure.savefig(drawn_png, format="png")
    assert not blank(drawn_png.getvalue()) and panel_contents(figure) == []


IN_BROWSER = ("gpt2", "bert", "tv_resnet", "tv_mobilenet_v3", "tv_vit", "lstm_lm", "transformer")
"""Real models whose reports are opened in Chromium; the other three (transformers' ViT, ResNet and MobileNetV2,
the same families and layer kinds as torchvision's above) have every figure checked without the browser, which
saves the PNG encoding and a minute of test time."""


def write_checked(folder: Path, name: str, monkeypatch: pytest.MonkeyPatch, encode: bool) -> tuple[Path, list[Any]]:
    """Write model `name`'s healthy report; return its page and, per figure, (alt text, its empty panels)."""
    run, spec = healthy(name), MODELS[name]
    args, kwargs, _ = spec.batch(torch.Generator().manual_seed(0))
    drawn: list[tuple[str, list[str]]] = []
    original = html.figure_img

    def checked(figure: Any, alt: str, dpi: int = 80) -> str:
        drawn.append((alt, panel_contents(figure)))
        return original(figure, alt, dpi) if encode else f'<img alt="{alt}">'

    monkeypatch.setattr(html, "figure_img", checked)
    page = write_report(
        folder,
        run.results,
        summary=summary(run.model, *args, **kwargs),
        findings=diagnose(run.results),
        meta={"model": name},
        weights=run.model,
    )
    overview = 6 + (1 if run.results.attention else 0)  # the per-head attention heatmaps where attention was found
    assert len(drawn) == overview + min(len(run.results.layers), MAX_LAYERS)  # overview, then one figure per layer
    assert [(alt, empty) for alt, empty in drawn if empty] == []  # every panel draws something or says why
    return page, drawn


@pytest.mark.parametrize("name", sorted(set(MODELS) - set(IN_BROWSER)))
def test_real_model_reports_have_no_empty_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    page, _ = write_checked(tmp_path / name, name, monkeypatch, encode=False)
    assert "No findings" in page.read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("name", IN_BROWSER)
def test_real_model_reports_render_in_chromium_with_no_empty_plot(
    tmp_path: Path, browser: Any, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    page, drawn = write_checked(tmp_path / name, name, monkeypatch, encode=True)
    session = browser.open(page.resolve().as_uri())
    boxes = browser.evaluate(
        session,
        "[...document.images].map(i => { const r = i.getBoundingClientRect();"
        " return [i.complete && i.naturalWidth > 100, r.x + scrollX, r.y + scrollY, r.width, r.height]; })",
    )
    assert len(boxes) == len(drawn)
    for (loaded, x, y, width, height), (alt, _) in zip(boxes, drawn, strict=True):
        clip = {"x": x, "y": y, "width": width, "height": height, "scale": 1}
        shot = browser.send("Page.captureScreenshot", session, format="png", clip=clip, captureBeyondViewport=True)
        assert loaded and not blank(base64.b64decode(shot["data"])), alt
    assert browser.evaluate(session, "document.querySelectorAll('.finding').length") == 0  # healthy: no findings
    assert browser.problems() == []


SCRIPTS = Path(__file__).resolve().parents[1] / "cli" / "scripts"


@pytest.mark.slow  # two `hookscope run`s (a GAN, a Hugging Face GPT-2), then every page in Chromium
def test_the_reports_of_a_gan_and_a_hugging_face_run_render_in_chromium(
    tmp_path: Path, browser: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from hookscope.cli import main

    pages = []
    for script in ("dcgan.py", "hf_gpt2.py"):
        assert main(["run", "--out", str(tmp_path / script), str(SCRIPTS / script)]) == 0, capsys.readouterr().err
        pages.append(tmp_path / script / "report.html")
    pages += [
        tmp_path / "dcgan.py" / "1-Discriminator" / "report.html",
        tmp_path / "dcgan.py" / "2-Generator" / "report.html",
    ]
    index = browser.open(pages[0].resolve().as_uri())  # the GAN's index: one section per model, with its findings
    assert browser.evaluate(index, "[...document.querySelectorAll('section.model h2 a')].map(a => a.textContent)") == [
        "Discriminator",
        "Generator",
    ]
    for page in pages[1:]:
        session = browser.open(page.resolve().as_uri())
        loaded = browser.evaluate(session, "[...document.images].map(i => i.complete && i.naturalWidth > 100)")
        assert loaded and all(loaded), page
        width, height = browser.evaluate(session, "[document.body.scrollWidth, document.body.scrollHeight]")
        clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}  # a page opened after the first has
        shot = browser.send("Page.captureScreenshot", session, format="png", clip=clip, captureBeyondViewport=True)
        png = base64.b64decode(shot["data"])  # no viewport of its own: the clip gives the size
        (tmp_path / f"{page.parent.name}.png").write_bytes(png)
        assert png.startswith(b"\x89PNG") and not blank(png), page
        print(f"screenshot: {tmp_path / f'{page.parent.name}.png'}")
    assert browser.problems() == []
