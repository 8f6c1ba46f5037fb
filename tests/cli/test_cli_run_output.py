"""What `hookscope run` leaves behind and shows: a reused --out folder holds only the new run (and the user's own
files), --exact and --capacity reach watch(), the crash banner reads as plain text, the index page lists each
model's findings, and a status line is drawn on a terminal only."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hookscope.cli._progress import StatusLine, is_terminal
from hookscope.cli._session import WatchedModel
from hookscope.results import WatchResults

TWO_MODELS = """
import torch, torch.nn as nn
torch.manual_seed(0)
for width in (1, 2):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, width))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 3), torch.randn(16, width)
    for step in range(3):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
"""


def folders_with_data(out: Path) -> list[str]:
    return sorted(str(p.parent.relative_to(out)) for p in out.rglob("results.safetensors"))


def test_a_reused_out_folder_holds_only_the_new_run_and_the_users_files(
    tmp_path: Path, hookscope: Callable[..., object], training_script: Callable[..., Path]
) -> None:
    out = tmp_path / "out"
    two, one = training_script(name="two.py", body=TWO_MODELS), training_script(steps=4, name="one.py")
    assert hookscope("run", "--out", str(out), str(two)).code == 0
    assert folders_with_data(out) == ["1-Sequential", "2-Sequential"]
    (out / "notes.txt").write_text("mine")
    (out / "2-Sequential" / "plot.png").write_bytes(b"mine too")
    assert hookscope("run", "--out", str(out), str(one)).code == 0
    assert folders_with_data(out) == ["."]  # the earlier models' data is gone: `report` cannot draw them
    assert not (out / "1-Sequential").exists()  # emptied, so removed
    assert sorted(p.name for p in (out / "2-Sequential").iterdir()) == ["plot.png"]  # the user's file stays
    assert (out / "notes.txt").read_text() == "mine"
    assert hookscope("report", str(out)).code == 0
    assert json.loads((out / "report.json").read_text())["meta"]["script"] == str(one)
    # and back: a single report's files give way to the index and the model folders
    assert hookscope("run", "--out", str(out), str(two)).code == 0
    assert folders_with_data(out) == ["1-Sequential", "2-Sequential"]
    assert not (out / "report.json").exists() and "hookscope reports" in (out / "report.html").read_text()
    assert (out / "notes.txt").read_text() == "mine"


def test_a_folder_a_report_did_not_write_is_left_alone(tmp_path: Path) -> None:
    from hookscope.report import remove_report

    (tmp_path / "report.html").write_text("<title>my own page</title>")
    (tmp_path / "report.json").write_text('{"meta": {"author": "me"}}')  # not hookscope's: no "hookscope" key
    assert remove_report(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.json"]


BIG_OUTPUT = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 400), nn.ReLU(), nn.Linear(400, 1))  # 64 x 400 = 25600 values: sampled
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(10):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
"""


@pytest.mark.parametrize("exact", [False, True])
def test_exact_and_capacity_reach_watch(
    exact: bool, tmp_path: Path, hookscope: Callable[..., object], training_script: Callable[..., Path]
) -> None:
    script = training_script(name="big.py", body=BIG_OUTPUT)
    flags = ["--capacity", "4", *(["--exact"] if exact else [])]
    done = hookscope("run", *flags, "--out", str(tmp_path / "out"), str(script))
    assert done.code == 0, done.err
    results = WatchResults.load(tmp_path / "out" / "results.safetensors")
    assert results.meta["exact"] is exact and results.meta["capacity"] == 4
    assert results.num_steps <= 4 and results.dropped.get("capacity", 0) > 0  # 10 steps into 4
    sampled = results.activations["0"]["sampled"]
    assert bool((sampled > 0).any()) is not exact  # a 25600-value output: sampled unless --exact
    page = (tmp_path / "out" / "report.html").read_text()
    assert ("<code>hookscope run --exact</code>" in page) is not exact  # the advice says how to follow it here


def test_capacity_all_and_bad_values(tmp_path: Path, hookscope: Callable[..., object]) -> None:
    from hookscope.cli._parser import build_parser

    args = build_parser().parse_args(["run", "--capacity", "all", "x.py"])
    assert args.capacity is None and args.exact is False
    done = hookscope("run", "--capacity", "0", "x.py")
    assert done.code == 2 and "argument --capacity: must be a positive int or 'all', got '0'" in done.err


def test_the_crash_banner_reads_as_plain_text(
    tmp_path: Path, hookscope: Callable[..., object], training_script: Callable[..., Path]
) -> None:
    script = training_script(steps=4, before_step="if step == 2: raise RuntimeError('\\x1b[1;31mboom\\x1b[0m')")
    done = hookscope("run", "--out", str(tmp_path / "out"), str(script))
    assert done.code == 1
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    assert document["meta"]["error"] == "RuntimeError: boom"
    page = (tmp_path / "out" / "report.html").read_text()
    assert "The run did not complete (raised: RuntimeError: boom)" in page and "U+001B" not in page


def test_the_index_page_lists_each_models_findings(tmp_path: Path) -> None:
    from hookscope.report import write_report
    from hookscope.report._write import write_index

    results = WatchResults(steps=torch.arange(2), layers={"fc": "Linear"})
    finding = {"severity": "error", "check": "nonfinite_forward", "path": "fc", "step": 1, "message": "NaN <b>"}
    one = write_report(tmp_path / "1-Net", results, findings=[finding], meta={"model": "Net"})
    two = write_report(tmp_path / "2-Head", results, findings=[], meta={"model": "Head"})
    three = write_report(tmp_path / "3-Tail", results, meta={"model": "Tail"})  # no diagnosis
    pages = [(name, page.relative_to(tmp_path)) for name, page in (("Net", one), ("Head", two), ("Tail", three))]
    index = write_index(tmp_path, pages, {"status": "completed"}).read_text()
    sections = index.split("<section class='model'>")[1:]
    assert [s.count("class='finding sev-error'") for s in sections] == [1, 0, 0]
    assert "nonfinite_forward" in sections[0] and "NaN &lt;b&gt;" in sections[0]
    assert "No findings" in sections[1] and "The diagnosis was not run" in sections[2]


# ---- the status line -------------------------------------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def model_entry(name: str, steps: int, loss: float | None) -> WatchedModel:
    from hookscope.watch import Watch

    entry = WatchedModel(name, torch.nn.Linear(1, 1), Watch())
    entry.steps, entry.last_loss = steps, None if loss is None else torch.tensor(loss)
    return entry


def test_the_status_line_updates_in_place_and_is_cleared_before_the_scripts_output() -> None:
    screen, now = Terminal(), [0.0]
    line = StatusLine(screen, interval=0.25, findings_every=1e9, clock=lambda: now[0])
    saved = (sys.stdout, sys.stderr)
    line.start()
    try:
        line.update([model_entry("Net", 1, 2.5)])
        now[0] = 0.1
        line.update([model_entry("Net", 2, 2.0)])  # too soon: not drawn
        print("the script's line", file=sys.stderr)
        now[0] = 0.5
        line.update([model_entry("Net", 3, 1.5), model_entry("GAN", 3, None)])
    finally:
        line.stop()
    assert (sys.stdout, sys.stderr) == saved
    assert screen.getvalue() == (
        "\r\x1b[Khookscope: Net step 1 · loss 2.5"
        "\r\x1b[K"  # cleared before the script writes
        "\r\x1b[Khookscope: Net step 3 · loss 1.5 | GAN step 3"
        "\r\x1b[K"  # cleared at the end
    )
    assert not is_terminal(io.StringIO()) and is_terminal(Terminal(), Terminal())


@pytest.mark.slow  # a fresh interpreter on a pseudo-terminal, ~3 s
def test_on_a_terminal_the_status_line_shows_steps_loss_and_the_scripts_lines_stay_whole(
    tmp_path: Path, training_script: Callable[..., Path]
) -> None:
    script = training_script(steps=5, before_step="print(f'line {step}')")
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "hookscope", "run", "--out", str(tmp_path / "out"), str(script)],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        cwd=tmp_path,
    )
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed: the process ended
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert process.wait(timeout=120) == 0
    text = shown.decode()
    assert "\r\x1b[Khookscope: Sequential step 1 · loss " in text
    for step in range(5):  # each of the script's lines starts a line of its own, whole
        assert re.search(rf"(^|\r\n|\x1b\[K)line {step}\r\n", text), text
    assert text.rstrip().endswith(f"hookscope: report written to {Path('out', 'report.html')}")  # from tmp_path
