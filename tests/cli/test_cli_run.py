"""`hookscope run script.py`: unmodified scripts watched through global hooks; the report is written however the
script ends, and the exit code is the script's."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hookscope.hooks import list_hooks
from hookscope.results import WatchResults


def read(folder: Path) -> tuple[WatchResults, dict]:
    return WatchResults.load(folder / "results.safetensors"), json.loads((folder / "report.json").read_text())


def test_the_example_is_watched_from_its_first_step(
    tmp_path: Path, hookscope: Callable[..., object], examples: Path
) -> None:
    done = hookscope("run", "--out", str(tmp_path), str(examples / "train_mlp.py"), "--steps", "12")
    assert done.code == 0, done.err
    assert "trained 12 steps" in done.out  # the script's own output and arguments
    results, document = read(tmp_path)
    assert results.steps.tolist() == list(range(12))  # watched from its first training forward
    assert list(results.layers) == ["0", "1", "2", "3", "4"]
    assert results.losses is not None and torch.isfinite(results.losses).all()  # nn.CrossEntropyLoss was logged
    assert document["meta"]["status"] == "completed" and document["meta"]["model"] == "Sequential"
    assert document["summary"]["totals"]["total_params"] == 2 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4
    assert document["findings"] is not None and (tmp_path / "weights.safetensors").is_file()
    assert not [h for h in list_hooks() if "hookscope-run" in h.tags]


def test_a_script_that_raises_midway_still_gets_its_report(
    tmp_path: Path, hookscope: Callable[..., object], examples: Path
) -> None:
    script = examples / "train_mlp.py"
    module_hooks = torch.nn.modules.module
    before = (len(module_hooks._global_forward_pre_hooks), len(module_hooks._global_forward_hooks))
    done = hookscope("run", "--select", "0", "--out", str(tmp_path), str(script), "--steps", "50", "--crash-at", "7")
    assert done.code == 1
    assert "RuntimeError: planted crash at step 7" in done.err and 'File "' in done.err
    assert "runpy" not in done.err  # the traceback starts in the script
    assert (len(module_hooks._global_forward_pre_hooks), len(module_hooks._global_forward_hooks)) == before
    assert not [h for h in list_hooks() if "hookscope-run" in h.tags]
    results, document = read(tmp_path)
    assert results.num_steps == 7  # steps 0..6
    assert document["meta"]["status"] == "raised" and "planted crash at step 7" in document["meta"]["error"]
    assert (
        "The run did not complete (raised: RuntimeError: planted crash at step 7)"
        in (tmp_path / "report.html").read_text()
    )


@pytest.mark.parametrize(
    ("before_step", "code", "status"),
    [
        ("if step == 3: raise SystemExit(3)", 3, "exited"),
        ("if step == 3: raise KeyboardInterrupt", 130, "interrupted"),
        ("if step == 3: import sys; sys.exit(0)", 0, "completed"),
    ],
)
def test_the_exit_code_is_the_scripts(
    tmp_path: Path,
    hookscope: Callable[..., object],
    training_script: Callable[..., Path],
    before_step: str,
    code: int,
    status: str,
) -> None:
    script = training_script(steps=6, before_step=before_step)
    done = hookscope("run", "--select", "0", "--out", str(tmp_path / "out"), str(script))
    assert done.code == code
    results, document = read(tmp_path / "out")
    assert document["meta"]["status"] == status and document["meta"]["exit_code"] == code
    assert results.num_steps == 3  # steps 0, 1 and 2 ran watched before step 3 stopped the script


def test_every_and_select(tmp_path: Path, hookscope: Callable[..., object], training_script: Callable[..., Path]):
    script = training_script(steps=9)
    done = hookscope("run", "--every", "2", "--select", "2", "--out", str(tmp_path / "out"), str(script))
    assert done.code == 0, done.err
    results, _ = read(tmp_path / "out")
    assert list(results.layers) == ["2"]
    assert results.num_steps == 5  # 9 watched steps, one in two


def test_each_trained_model_gets_a_report_and_an_index(
    tmp_path: Path, hookscope: Callable[..., object], training_script: Callable[..., Path]
) -> None:
    first = training_script(steps=3, name="first.py").read_text()
    second = training_script(steps=4, name="second.py").read_text().replace("nn.Linear(4, 1)", "nn.Linear(4, 2)")
    script = training_script(name="two.py", body=first + second.replace("torch.randn(16, 1)", "torch.randn(16, 2)"))
    done = hookscope("run", "--select", "0", "--out", str(tmp_path / "out"), str(script))
    assert done.code == 0, done.err
    index = (tmp_path / "out" / "report.html").read_text()
    assert 'href="1-Sequential/report.html"' in index and 'href="2-Sequential/report.html"' in index
    first, _ = read(tmp_path / "out" / "1-Sequential")
    second, _ = read(tmp_path / "out" / "2-Sequential")
    assert (first.num_steps, second.num_steps) == (3, 4)


def test_a_script_that_trains_nothing_is_said_so(
    tmp_path: Path, hookscope: Callable[..., object], training_script: Callable[..., Path]
) -> None:
    script = training_script(name="idle.py", body="print('nothing to train')\n")
    done = hookscope("run", "--out", str(tmp_path / "out"), str(script))
    assert done.code == 0 and "nothing to train" in done.out
    _, document = read(tmp_path / "out")
    assert "no model was trained (no backward reached a model run in training mode)" in document["meta"]["notes"]


def test_run_usage_errors(tmp_path: Path, hookscope: Callable[..., object]) -> None:
    done = hookscope("run", str(tmp_path / "missing.py"))
    assert done.code == 2
    assert done.err.strip().splitlines() == [
        f"hookscope: error: script.py must be an existing file, got {str(tmp_path / 'missing.py')!r} "
        "(--verbose shows the traceback)"
    ]
    done = hookscope("run", "--every", "-1", "x.py")
    assert done.code == 2 and "argument --every: must be a positive int, got '-1'" in done.err


def test_python_dash_m_hookscope_runs_a_script(tmp_path: Path, training_script: Callable[..., Path]) -> None:
    script = training_script(body="import torch\nprint('no optimizer here')\nraise ValueError('x')\n")
    done = subprocess.run(
        [sys.executable, "-m", "hookscope", "run", "--out", str(tmp_path / "out"), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "ValueError: x" in done.stderr and "hookscope: report written to" in done.stderr
    assert json.loads((tmp_path / "out" / "report.json").read_text())["meta"]["status"] == "raised"


def test_a_select_that_matches_nothing_is_noted_and_the_script_still_runs(
    tmp_path: Path, hookscope: Callable[..., object], training_script: Callable[..., Path]
) -> None:
    done = hookscope("run", "--select", "nope.*", "--out", str(tmp_path / "out"), str(training_script(steps=3)))
    assert done.code == 0
    assert "hookscope: could not watch Sequential: select must name an existing module path" in done.err
    assert "got 'nope.*'. The module paths are '0', '1', '2'." in done.err  # nothing close: where they start
    _, document = read(tmp_path / "out")
    assert document["meta"]["notes"].startswith("could not watch Sequential")
