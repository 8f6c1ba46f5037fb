"""`hookscope report DIR` draws the page again from the saved data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from hookscope.report import write_report
from hookscope.results import WatchResults


def small_results() -> WatchResults:
    steps = torch.arange(3)
    results = WatchResults(steps=steps, layers={"fc": "Linear"})
    results.activations["fc"] = {"mean": steps.float(), "std": steps.float() + 1, "near_zero": torch.zeros(3)}
    return results


def test_report_redraws_the_same_page(tmp_path: Path, hookscope: Callable[..., object]) -> None:
    page = write_report(tmp_path, small_results(), findings=[])
    first = page.read_text()
    page.unlink()
    done = hookscope("report", str(tmp_path))
    assert done.code == 0 and done.out.strip() == f"report written to {page}"
    assert page.read_text() == first


def test_report_errors_are_one_line(tmp_path: Path, hookscope: Callable[..., object]) -> None:
    done = hookscope("report", str(tmp_path / "nope"))
    assert done.code == 2 and "DIR must be a report folder, got" in done.err
    done = hookscope("report", str(tmp_path))
    assert done.code == 2 and "folder must hold a hookscope report's data" in done.err
    assert len(done.err.strip().splitlines()) == 1


def test_version_and_help(hookscope: Callable[..., object]) -> None:
    done = hookscope("--version")
    assert done.code == 0 and done.out.strip() == "hookscope 0.1.0"
    done = hookscope("--help")
    assert done.code == 0
    for command in ("demo", "summary", "run", "report"):
        assert command in done.out
    done = hookscope()
    assert done.code == 2 and "the following arguments are required: COMMAND" in done.err


def test_report_redraws_every_page_of_a_multi_model_run_folder(
    tmp_path: Path, hookscope: Callable[..., object]
) -> None:
    from hookscope.report._write import write_index

    pages = []
    for folder, name in (("2-Encoder", "Encoder"), ("10-Head", "Head")):  # in number order, not text order
        page = write_report(tmp_path / folder, small_results(), meta={"model": name, "status": "completed"})
        pages.append((name, page.relative_to(tmp_path)))
    write_index(tmp_path, pages, {"status": "completed"})
    drawn = {path: path.read_text() for path in tmp_path.rglob("report.html")}
    for path in drawn:
        path.unlink()
    done = hookscope("report", str(tmp_path))
    assert done.code == 0 and done.out.strip() == f"report written to {tmp_path / 'report.html'}"
    assert {path: path.read_text() for path in tmp_path.rglob("report.html")} == drawn
