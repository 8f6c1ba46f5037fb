"""The report in a real browser (headless Chromium over the DevTools pipe): sections render, no console errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hookscope.report import write_report
from hookscope.watch import WatchResults

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
