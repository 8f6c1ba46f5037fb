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

from hookscope.report import render_report, write_report
from hookscope.report._escape import safe_filename
from hookscope.results import WatchResults
from hookscope.stats._tables import SMALL_BELOW
from hookscope.watch import watch

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
META = {"model": "<script>alert(4)</script>", "status": "interrupted", "error": "KeyboardInterrupt <i>x</i>"}


@pytest.fixture(scope="module")
def written(
    tmp_path_factory: pytest.TempPathFactory, make_results: Callable[..., WatchResults]
) -> tuple[Path, WatchResults, str]:
    """One report of hostile layer names, with findings, a summary, weights and an interrupted run."""
    folder = tmp_path_factory.mktemp("report")
    results = make_results(layers=HOSTILE)
    results.layers["attn.out_proj"] = "Linear"
    results.unobserved["attn.out_proj"] = "watch the MultiheadAttention output instead"
    results.dropped["capacity"] = 7
    summary = {"rows": [{"path": "", "type": "Net", "params": 352, "depth": 0}], "totals": {"total_params": 352}}
    page = write_report(folder, results, findings=[FINDING], summary=summary, meta=META, weights=torch.nn.Linear(2, 3))
    return folder, results, page.read_text(encoding="utf-8")


def test_sections_come_in_order_with_plots_inline(written: tuple[Path, WatchResults, str]) -> None:
    folder, _, page = written
    assert re.findall(r"<section id=['\"]([a-z]+)['\"]", page) == [
        "findings",
        "summary",
        "overview",
        "layers",
        "details",
    ]
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    # loss, activations, output and parameter gradient flow, update ratios, weights + one per observed layer
    assert len(images) == 6 + len(HOSTILE)
    assert all(base64.b64decode(image).startswith(b"\x89PNG\r\n\x1a\n") for image in images)
    assert "http://" not in page and "https://" not in page and "<script" not in page
    assert "60% of units never active" in page and "&lt;b&gt;bold&lt;/b&gt;" in page
    assert sorted(p.name for p in folder.iterdir()) == [
        "report.html",
        "report.json",
        "results.safetensors",
        "weights.safetensors",
    ]


def test_hostile_names_are_inert(written: tuple[Path, WatchResults, str]) -> None:
    _, _, page = written
    for raw in (*HOSTILE[:3], "<script", "<i>x</i>", "\u202e"):
        assert raw not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "evil&lt;U+202E&gt;gnp.exe" in page
    assert "default-src 'none'" in page


def test_a_run_that_did_not_complete_says_so_first(written: tuple[Path, WatchResults, str]) -> None:
    _, _, page = written
    banner = re.search(r'<p class="banner" id="status">(.*?)</p>', page)
    assert banner and "interrupted: KeyboardInterrupt &lt;i&gt;x&lt;/i&gt;" in banner.group(1)
    assert "covers the 5 steps recorded" in banner.group(1)
    assert page.index('id="status"') < page.index('id="findings"')


def test_unobserved_layers_and_dropped_counts_are_listed(written: tuple[Path, WatchResults, str]) -> None:
    _, _, page = written
    assert "Never observed: watch the MultiheadAttention output instead" in page
    assert re.search(r"<td>capacity</td><td class=\"num\">7</td>", page)


def test_data_beside_the_page_round_trips(written: tuple[Path, WatchResults, str]) -> None:
    folder, results, _ = written
    loaded = WatchResults.load(folder / "results.safetensors")
    for path, stats in results.activations.items():
        for stat, values in stats.items():
            torch.testing.assert_close(loaded.activations[path][stat], values)
    document = json.loads((folder / "report.json").read_text())
    assert document["findings"] == [FINDING]
    assert document["meta"]["status"] == "interrupted" and document["meta"]["torch"] == torch.__version__


def test_render_report_draws_the_same_page_from_saved_data(written: tuple[Path, WatchResults, str]) -> None:
    folder, _, page = written
    assert render_report(folder).read_text(encoding="utf-8") == page


def test_findings_not_run_and_none_found_read_differently(
    tmp_path: Path, make_results: Callable[..., WatchResults]
) -> None:
    results = make_results(layers=("0",))
    assert "The diagnosis was not run" in write_report(tmp_path / "a", results).read_text()
    assert "No findings" in write_report(tmp_path / "b", results, findings=[]).read_text()


def test_a_failed_drawing_leaves_the_previous_report_whole(tmp_path: Path, make_results: Callable[..., WatchResults]):
    before = write_report(tmp_path, make_results(layers=("0",)), weights={"w": torch.ones(3)}).read_bytes()
    saved = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    broken = make_results(layers=("0",))
    broken.activations["0"]["mean"] = torch.zeros(9)  # longer than the steps: the drawing fails
    with pytest.raises(ValueError):
        write_report(tmp_path, broken)
    assert (tmp_path / "report.html").read_bytes() == before
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == saved  # no temporary file left either


def test_write_report_argument_errors(tmp_path: Path, make_results: Callable[..., WatchResults]) -> None:
    with pytest.raises(
        TypeError, match=r"results must be a WatchResults, got \{\}; use the results of watch\(model\)\.results\(\)"
    ):
        write_report(tmp_path, {})  # type: ignore[arg-type]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"out_dir must be a folder, got the file .*file'; pick another --out"):
        write_report(tmp_path / "file", make_results())


def test_render_report_refuses_missing_and_pickled_data(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"folder must hold a hookscope report's data"):
        render_report(tmp_path)
    (tmp_path / "report.json").write_text("{}")
    (tmp_path / "results.safetensors").write_bytes(pickle.dumps({"steps": [1, 2]}))
    with pytest.raises(ValueError, match=r"results.safetensors' declares a \d+-byte header"):
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


@pytest.mark.parametrize("exact", [False, True])
def test_layers_described_from_a_sample_say_so_and_exact_ones_do_not(tmp_path: Path, exact: bool) -> None:
    """A layer whose output has SMALL_BELOW values or more is sampled unless `exact=True`; a small one never is."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 512), torch.nn.Linear(512, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, optimizer, select=["0", "1"], exact=exact) as w:
        for _ in range(3):
            model(torch.randn(64, 8)).sum().backward()  # layer 0: 64 x 512 = 32768 values; layer 1: 128
            optimizer.step()
            optimizer.zero_grad()
    results = w.results()
    assert SMALL_BELOW <= 64 * 512 and results.activations["0"]["sampled"].tolist() == [0.0 if exact else 1.0] * 3
    page = write_report(tmp_path, results).read_text(encoding="utf-8")
    sections = dict(re.findall(r"<section class='layer' id='layer-(\d)'>(.*?)</section>", page))
    assert ("Estimated from a sample in 3 of 3 recorded steps" in sections["0"]) is not exact
    assert "Estimated from a sample" not in sections["1"]
