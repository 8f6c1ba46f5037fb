"""write_report / render_report: one self-contained page, its data beside it, names inert, writes atomic."""

from __future__ import annotations

import base64
import json
import pickle
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hookscope.report import render_report, safe_filename, write_report
from hookscope.watch import WatchResults

HOSTILE = ("<img src=x onerror=alert(1)>", "</script><script>alert(2)</script>", "evil\u202egnp.exe", "a$b")
FINDING = {
    "severity": "warning",
    "check": "dead_units",
    "path": "<b>bold</b>",
    "step": 3,
    "message": "60% of units never active",
    "evidence": {"fraction": 0.6},
    "advice": "lower the bias",
}


def section_ids(page: str) -> list[str]:
    return re.findall(r"<section id=['\"]([a-z]+)['\"]", page)


def test_report_holds_sections_in_order_and_plots_inline(tmp_path: Path, make_results: Callable[..., WatchResults]):
    results = make_results()
    page_path = write_report(tmp_path / "out", results, findings=[FINDING], summary={"rows": [{"path": "0"}]})
    page = page_path.read_text(encoding="utf-8")
    assert page_path == tmp_path / "out" / "report.html"
    assert section_ids(page) == ["findings", "summary", "overview", "layers", "details"]
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    # loss, activations, output and parameter gradient flow, update ratios + one per layer
    assert len(images) == 5 + 2
    assert all(base64.b64decode(image).startswith(b"\x89PNG\r\n\x1a\n") for image in images)
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "60% of units never active" in page and "&lt;b&gt;bold&lt;/b&gt;" in page


def test_data_beside_the_page_round_trips(tmp_path: Path, make_results: Callable[..., WatchResults]) -> None:
    results = make_results()
    write_report(tmp_path, results, findings=[FINDING], meta={"script": "train.py"}, weights=torch.nn.Linear(2, 3))
    loaded = WatchResults.load(tmp_path / "results.safetensors")
    for path, stats in results.activations.items():
        for stat, values in stats.items():
            torch.testing.assert_close(loaded.activations[path][stat], values)
    document = json.loads((tmp_path / "report.json").read_text())
    assert document["findings"] == [FINDING]
    assert document["meta"]["script"] == "train.py" and document["meta"]["torch"] == torch.__version__
    assert (tmp_path / "weights.safetensors").is_file()


def test_render_report_draws_the_same_page_from_saved_data(tmp_path: Path, make_results: Callable[..., WatchResults]):
    first = write_report(tmp_path, make_results(), findings=[], weights={"w": torch.arange(10.0)}).read_text()
    (tmp_path / "report.html").unlink()
    assert render_report(tmp_path).read_text() == first
    assert "No findings" in first


def test_hostile_names_are_inert(tmp_path: Path, make_results: Callable[..., WatchResults]) -> None:
    results = make_results(layers=HOSTILE)
    results.unobserved["<svg onload=alert(3)>"] = "never called"
    meta = {"model": "<script>alert(4)</script>", "status": "raised", "error": "ValueError('<i>x</i>')"}
    page = write_report(tmp_path, results, meta=meta, findings=[{**FINDING, "path": HOSTILE[0]}]).read_text()
    for raw in (*HOSTILE[:3], "<svg", "<script", "<i>x</i>", "\u202e"):
        assert raw not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "evil&lt;U+202E&gt;gnp.exe" in page
    assert "default-src 'none'" in page


def test_a_run_that_did_not_complete_says_so_first(tmp_path: Path, make_results: Callable[..., WatchResults]):
    meta = {"status": "interrupted", "error": "KeyboardInterrupt"}
    page = write_report(tmp_path, make_results(), meta=meta).read_text()
    banner = re.search(r'<p class="banner" id="status">(.*?)</p>', page)
    assert banner and "interrupted: KeyboardInterrupt" in banner.group(1) and "5 steps" in banner.group(1)
    assert page.index('id="status"') < page.index('id="findings"')
    assert "The diagnosis was not run" in page


def test_unobserved_layers_and_dropped_counts_are_listed(tmp_path: Path, make_results: Callable[..., WatchResults]):
    results = make_results()
    results.layers["attn.out_proj"] = "Linear"
    results.unobserved["attn.out_proj"] = "watch the MultiheadAttention output instead"
    results.dropped["capacity"] = 7
    page = write_report(tmp_path, results).read_text()
    assert "Never observed: watch the MultiheadAttention output instead" in page
    assert re.search(r"<td>capacity</td><td class=\"num\">7</td>", page)


def test_a_failed_drawing_leaves_the_previous_report_whole(tmp_path: Path, make_results: Callable[..., WatchResults]):
    before = write_report(tmp_path, make_results()).read_bytes()
    saved = (tmp_path / "results.safetensors").read_bytes()
    broken = make_results()
    broken.activations["0"]["mean"] = torch.zeros(9)  # longer than the steps: the drawing fails
    with pytest.raises(ValueError):
        write_report(tmp_path, broken)
    assert (tmp_path / "report.html").read_bytes() == before
    assert (tmp_path / "results.safetensors").read_bytes() == saved
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_write_report_argument_errors(tmp_path: Path, make_results: Callable[..., WatchResults]) -> None:
    with pytest.raises(TypeError, match=r"results must be a WatchResults \(from watch\(\).results\(\)\), got dict"):
        write_report(tmp_path, {})  # type: ignore[arg-type]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"out_dir must be a folder, got the file .*file'; pick another --out"):
        write_report(tmp_path / "file", make_results())


def test_render_report_refuses_missing_and_pickled_data(tmp_path: Path, make_results: Callable[..., WatchResults]):
    with pytest.raises(FileNotFoundError, match=r"folder must hold a hookscope report's data"):
        render_report(tmp_path)
    write_report(tmp_path, make_results())
    (tmp_path / "results.safetensors").write_bytes(pickle.dumps({"steps": [1, 2]}))
    with pytest.raises(ValueError, match=r"not a safetensors file|truncated|not a readable"):
        render_report(tmp_path)
    (tmp_path / "report.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"report.json in .* must hold a JSON object, got list"):
        render_report(tmp_path)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("../../x", "x"),
        ("..", "model"),
        ("/etc/passwd", "etc_passwd"),
        ("a b\u202ec", "a_b_c"),
        ("Net-2.v1", "Net-2.v1"),
    ],
)
def test_safe_filename_stays_inside_its_folder(tmp_path: Path, name: str, expected: str) -> None:
    cleaned = safe_filename(name)
    assert cleaned == expected
    assert (tmp_path / cleaned).resolve().parent == tmp_path.resolve()
