"""Each tutorial example runs and prints what a reference computation gives."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn as nn

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(name: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_double_grad() -> None:
    assert "gradient: [4.0, 8.0, 12.0]" in run("double_grad.py")


def test_verbose_execution_prints_each_child_shape() -> None:
    lines = run("verbose_execution.py").splitlines()
    assert lines == [
        "0 (Conv2d): (2, 4, 6, 6)",
        "1 (ReLU): (2, 4, 6, 6)",
        "2 (Flatten): (2, 144)",
        "3 (Linear): (2, 10)",
    ]


def test_forward_check_matches_reference_means() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(32, 8)
    expected, h = [], x
    for layer in model:
        h = layer(h)
        expected.append(h.mean().item())
    got = [float(v) for v in re.findall(r"mean (-?[\d.]+)", run("forward_check.py"))]
    assert len(got) == 3 and all(abs(a - b) < 1e-5 for a, b in zip(got, expected, strict=True))


def test_gradient_check_matches_reference_means() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    model(torch.randn(32, 8)).pow(2).mean().backward()
    expected = {name: p.grad.mean().item() for name, p in model.named_parameters()}
    got = dict(re.findall(r"^(\S+): mean gradient (-?[\d.]+)$", run("gradient_check.py"), flags=re.M))
    assert got.keys() == expected.keys()
    assert all(abs(float(got[k]) - v) < 1e-5 for k, v in expected.items())
