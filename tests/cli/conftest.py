"""CLI test helpers: run `hookscope` in this process and capture what it prints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from hookscope.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass
class Outcome:
    code: int
    out: str
    err: str


@pytest.fixture
def hookscope(capsys: pytest.CaptureFixture[str]) -> Callable[..., Outcome]:
    """Run `hookscope *argv` in-process; return the exit code and what went to stdout and stderr."""

    def run(*argv: str) -> Outcome:
        capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as stop:  # argparse: --help, usage errors
            code = stop.code if isinstance(stop.code, int) else 1
        captured = capsys.readouterr()
        return Outcome(code, captured.out, captured.err)

    return run


@pytest.fixture
def examples() -> Path:
    return EXAMPLES


@pytest.fixture
def training_script(tmp_path: Path) -> Callable[..., Path]:
    """Write a tiny training script (see `tiny_training`) into `tmp_path`; return its path."""

    def write(steps: int = 6, before_step: str = "pass", name: str = "train.py", body: str | None = None) -> Path:
        path = tmp_path / name
        path.write_text(body if body is not None else tiny_training(steps, before_step))
        return path

    return write


TINY_TRAINING = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.MSELoss()
x, y = torch.randn(16, 3), torch.randn(16, 1)
for step in range({steps}):
    {before_step}
    loss = loss_fn(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def tiny_training(steps: int = 6, before_step: str = "pass") -> str:
    """Return a tiny plain-PyTorch training script; `before_step` runs at the top of each step."""
    return TINY_TRAINING.format(steps=steps, before_step=before_step)
