"""The `hookscope` command in a base install: torch, numpy and safetensors at their declared lower bounds, no extra.

The virtualenv takes about 30 s to build (torch from its local CPU wheel, never from a registry) and is kept
between runs in the system's temporary folder, one per checkout, rebuilt when pyproject.toml, constraints.txt or
the interpreter change; with it built, this module takes about 12 s (each command imports torch). It skips only
when the virtualenv cannot be built, and never under CI=true.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import torch

from hookscope.cli._errors import EXIT_MISSING_EXTRA
from hookscope.results import WatchResults

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BASE = ("torch", "numpy", "safetensors")
# The lowest declared minor line of each (tests/package/test_packaging.py checks these against pyproject.toml);
# torch is the CPU wheel this checkout's own environment was installed from.
REQUIREMENTS = (f"torch=={torch.__version__}", "numpy==1.24.*", "safetensors==0.4.*")

SCRIPT = """
import sys, torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 3), torch.randn(16, 1)
for step in range(6):
    if step == int(sys.argv[1]):
        raise RuntimeError("planted crash")
    loss = nn.MSELoss()(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _inputs() -> str:
    parts = [sys.version, *REQUIREMENTS, str(ROOT)]
    parts += [(ROOT / name).read_text() for name in ("pyproject.toml", "constraints.txt")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _pip(venv: Path, *args: str) -> None:
    command = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)


def _build(venv: Path, work: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True, timeout=120)
    # torch alone and from no index: pip's find-links (the local CPU wheel) or nothing, never a multi-GB download
    _pip(venv, "--no-index", "--no-deps", REQUIREMENTS[0])
    pinned = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.split("==")[0] not in BASE]
    (work / "constraints.txt").write_text("\n".join(pinned) + "\n")
    _pip(venv, "-c", str(work / "constraints.txt"), *REQUIREMENTS)
    _pip(venv, "--no-deps", "-e", str(ROOT))


@pytest.fixture(scope="module")
def base_venv() -> Iterator[Path]:
    """A virtualenv holding hookscope and only its base dependencies, built once and kept between runs."""
    cache = Path(tempfile.gettempdir()) / "hookscope-base-install" / hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    cache.mkdir(parents=True, exist_ok=True)
    venv, stamp = cache / "venv", cache / "inputs.sha256"
    with open(cache / "lock", "w") as lock:  # xdist workers and parallel runs build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.is_file() or stamp.read_text() != _inputs():
            stamp.unlink(missing_ok=True)
            try:
                _build(venv, cache)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
                detail = " ".join(str(getattr(err, "stderr", "") or err).split())[-600:]
                if os.environ.get("CI"):
                    pytest.fail(f"the base-install virtualenv must build under CI: {detail}")
                pytest.skip(f"cannot build a base-install virtualenv here: {detail}")
            stamp.write_text(_inputs())
    yield venv


def hookscope(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    return subprocess.run(
        [str(venv / "bin" / "hookscope"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_virtualenv_holds_the_lower_bounds_and_no_extra(base_venv: Path) -> None:
    site = next((base_venv / "lib").glob("python3.*/site-packages"))
    installed = {d.metadata["Name"].lower(): d.version for d in metadata.distributions(path=[str(site)])}
    assert installed["torch"] == torch.__version__
    assert installed["numpy"].startswith("1.24.") and installed["safetensors"].startswith("0.4.")
    assert not {"matplotlib", "rich", "scikit-learn", "pandas"} & set(installed)
    ours = next(metadata.distributions(path=[str(site)], name="hookscope"))
    assert ours.metadata["Requires-Python"] == ">=3.11" and ours.metadata["License-Expression"] == "MIT"
    assert ours.read_text("licenses/LICENSE") == (ROOT / "LICENSE").read_text()  # the licence ships with it


def test_run_saves_the_data_then_names_the_plot_extra(base_venv: Path, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    done = hookscope(base_venv, "run", "--out", "out", "train.py", "99", cwd=tmp_path)
    assert done.returncode == EXIT_MISSING_EXTRA, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "hookscope: error: the data is saved in out, but drawing report.html needs matplotlib, not installed: "
        "pip install 'hookscope[plot]', then hookscope report out"
    )
    results = WatchResults.load(tmp_path / "out" / "results.safetensors")
    assert results.steps.tolist() == [0, 1, 2, 3, 4, 5]  # watched from its first training step
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    assert document["meta"]["status"] == "completed" and document["findings"] is not None
    assert not (tmp_path / "out" / "report.html").exists()
    report = hookscope(base_venv, "report", "out", cwd=tmp_path)  # what the message says to run, still refused
    assert report.returncode == EXIT_MISSING_EXTRA
    assert report.stderr == (
        "hookscope: error: hookscope report needs matplotlib, not installed: pip install 'hookscope[plot]'\n"
    )


def test_a_script_that_fails_keeps_its_exit_code_and_its_data(base_venv: Path, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    done = hookscope(base_venv, "run", "--out", "out", "train.py", "4", cwd=tmp_path)
    assert done.returncode == 1  # the script's own failure outranks the missing page
    assert "RuntimeError: planted crash" in done.stderr and "pip install 'hookscope[plot]'" in done.stderr
    assert WatchResults.load(tmp_path / "out" / "results.safetensors").num_steps == 4  # steps 0 to 3


def test_demo_names_its_extra_in_one_line_before_training(base_venv: Path, tmp_path: Path) -> None:
    demo = hookscope(base_venv, "demo", "--out", "demo", cwd=tmp_path)
    assert demo.returncode == EXIT_MISSING_EXTRA and demo.stdout == ""  # refused before any training
    assert demo.stderr == (
        "hookscope: error: hookscope demo needs rich, scikit-learn, matplotlib, not installed: "
        "pip install 'hookscope[cli]'\n"
    )


def test_summary_prints_plain_text_without_rich(base_venv: Path, tmp_path: Path) -> None:
    (tmp_path / "factory.py").write_text("import torch.nn as nn\ndef build():\n    return nn.Linear(3, 4)\n")
    done = hookscope(base_venv, "summary", "factory.py:build", "--input-shape", "2,3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Total params: 16" in done.stdout  # 3 * 4 + 4
