"""pytorch/examples' `word_language_model` runs end to end under `hookscope run`, printing what it prints bare.

The example saves the whole model with `torch.save(model, f)` and loads it back with the weights-only
`torch.load(f)` given only its own classes (issue 26: under `hookscope run` the pickle named hookscope's
`InertHook`, which the weights-only unpickler refuses). The vendored example is unmodified
(`tests/fixtures/word_language_model/README.md`); the runner below registers the example's classes as safe globals,
as the current upstream `main.py` does around its `torch.load`, then runs `main.py` as a script.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "word_language_model"

RUNNER = """
import runpy, sys
from pathlib import Path
import torch

fixture = sys.argv[1]
sys.path.insert(0, fixture)
import model  # the example's own module: main.py imports this same one

torch.serialization.add_safe_globals(  # upstream main.py's list for the RNN models
    [model.RNNModel, torch.nn.Dropout, torch.nn.Linear, torch.nn.GRU, torch.nn.LSTM, torch.nn.RNN, torch.nn.Embedding]
)
sys.argv = [str(Path(fixture) / "main.py"), *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

SIZES = ("--emsize", "8", "--nhid", "8", "--nlayers", "1", "--epochs", "1", "--bptt", "5", "--batch_size", "4")


def _run(command: list[str], cwd: Path) -> tuple[int, str, str]:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=240, check=False)
    return done.returncode, done.stdout, done.stderr


def _steady(text: str) -> str:
    """The printed output without its wall-clock times (ms/batch, epoch time)."""
    return re.sub(r"(ms/batch|time:)\s+[\d.]+", r"\1 <t>", text)


@pytest.mark.slow
def test_word_language_model_prints_the_same_under_hookscope_run(tmp_path: Path) -> None:
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER, encoding="utf-8")
    outputs = {}
    for name, prefix in (("bare", [sys.executable]), ("hookscope", [sys.executable, "-m", "hookscope", "run"])):
        options = ["--out", str(tmp_path / "report")] if name == "hookscope" else []
        arguments = [str(FIXTURE), "--data", str(FIXTURE / "data" / "tiny"), *SIZES, "--log-interval", "5"]
        arguments += ["--save", str(tmp_path / f"{name}.pt")]
        code, out, err = _run([*prefix, *options, str(runner), *arguments], tmp_path)
        assert code == 0, err
        outputs[name] = _steady(out)
        if name == "hookscope":
            assert "hookscope: report written to" in err  # it did watch the model
            assert b"hookscope" not in (tmp_path / "hookscope.pt").read_bytes()
    assert "| End of training | test loss" in outputs["bare"]
    assert outputs["hookscope"] == outputs["bare"]
