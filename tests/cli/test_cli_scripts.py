"""`hookscope run` on unmodified scripts in the style of pytorch/examples (tests/cli/scripts): the script prints
exactly what it prints without hookscope, every training step is recorded, and each model's losses are the ones
the script computed for that model (a DCGAN's discriminator and generator each get their own)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hookscope.cli._script import run_script
from hookscope.results import WatchResults

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def plain(script: str, args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What the script prints when it runs without hookscope."""
    capsys.readouterr()
    assert run_script(SCRIPTS / script, args).status == "completed"
    return capsys.readouterr().out


def watched(
    script: str, args: list[str], out: Path, hookscope: Callable[..., object]
) -> tuple[str, dict[str, WatchResults], str]:
    """Run under `hookscope run`; return what the script printed, each model's results by name, and the notes."""
    done = hookscope("run", "--out", str(out), str(SCRIPTS / script), *args)
    assert done.code == 0, done.err
    folders = [out] if (out / "results.safetensors").exists() else sorted(p for p in out.iterdir() if p.is_dir())
    results = {}
    for folder in folders:
        document = json.loads((folder / "report.json").read_text())
        results[document["meta"]["model"]] = WatchResults.load(folder / "results.safetensors")
    notes = json.loads((folders[0] / "report.json").read_text())["meta"].get("notes", "")
    return done.out, results, notes


def numbers(pattern: str, text: str) -> torch.Tensor:
    return torch.tensor([float(value) for value in re.findall(pattern, text)], dtype=torch.float64)


@pytest.mark.slow  # about 4 s each (the script and its report)
@pytest.mark.parametrize("use_optimizer", [False, True], ids=["hand-written-sgd", "optimizer"])
def test_word_language_model(
    use_optimizer: bool, tmp_path: Path, hookscope: Callable[..., object], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--save", str(tmp_path / "model.pt"), *(["--use-optimizer"] if use_optimizer else [])]
    expected = plain("word_language_model.py", args, capsys)
    printed, results, notes = watched("word_language_model.py", args, tmp_path / "out", hookscope)
    assert printed == expected  # the script's own output, unchanged; it saved and loaded its model every epoch
    losses = numbers(r"\| loss (\S+)", printed)
    (rnn,) = results.values()
    assert rnn.steps.tolist() == list(range(len(losses)))  # every training batch, the first one included
    assert rnn.losses is not None
    torch.testing.assert_close(rnn.losses, losses, rtol=1e-5, atol=1e-6)  # F.nll_loss-style, captured at backward
    assert ("hand-written updates" in notes) is not use_optimizer
    assert torch.isfinite(rnn.param_grads["decoder.weight"]["norm"]).all()
    if use_optimizer:
        assert torch.isfinite(rnn.update_ratios["decoder.weight"]).all()


@pytest.mark.slow  # about 7 s (two reports)
def test_dcgan_each_model_gets_its_own_losses(
    tmp_path: Path, hookscope: Callable[..., object], capsys: pytest.CaptureFixture[str]
) -> None:
    expected = plain("dcgan.py", [], capsys)
    printed, results, _ = watched("dcgan.py", [], tmp_path / "out", hookscope)
    assert printed == expected
    assert sorted(results) == ["Discriminator", "Generator"]
    for name, pattern in (("Discriminator", r"Loss_D: (\S+)"), ("Generator", r"Loss_G: (\S+)")):
        losses = numbers(pattern, printed)
        assert results[name].losses is not None, name
        torch.testing.assert_close(results[name].losses[:5], losses, rtol=1e-5, atol=1e-6)  # the first one included
    assert results["Generator"].steps.tolist() == list(range(5))  # one per optimizer step
    # the discriminator runs once more after its last step (for the generator's loss): an unfinished step, labelled
    assert results["Discriminator"].steps.tolist() == list(range(6))
    assert results["Discriminator"].meta["step_labels"] == {"unfinished": [5]}
    assert torch.isnan(results["Discriminator"].losses[5])


def test_an_lbfgs_script_records_its_closure_steps_and_not_its_prediction(
    tmp_path: Path, hookscope: Callable[..., object], capsys: pytest.CaptureFixture[str]
) -> None:
    expected = plain("lbfgs.py", [], capsys)
    printed, results, _ = watched("lbfgs.py", [], tmp_path / "out", hookscope)
    assert printed == expected
    (model,) = results.values()
    assert model.steps.tolist() == [0, 1, 2]
    assert model.losses is not None  # what step(closure) returned: the closure's first loss
    torch.testing.assert_close(model.losses, numbers(r"loss (\S+)", printed), rtol=1e-5, atol=1e-6)
    assert torch.isfinite(model.update_ratios["0.weight"]).all()  # also the first, seen from inside its step()
    assert torch.isfinite(model.param_grads["0.weight"]["norm"]).all()
    assert model.dropped.get("no_grad") == 3  # the prediction pass in train mode: not a step


def test_a_hand_written_sgd_script_is_watched(
    tmp_path: Path, hookscope: Callable[..., object], capsys: pytest.CaptureFixture[str]
) -> None:
    expected = plain("sgd_by_hand.py", [], capsys)
    printed, results, notes = watched("sgd_by_hand.py", [], tmp_path / "out", hookscope)
    assert printed == expected
    (fc,) = results.values()
    assert fc.steps.tolist() == [0, 1, 2, 3] and fc.losses is not None
    torch.testing.assert_close(fc.losses, numbers(r"loss (\S+)", printed), rtol=1e-5, atol=1e-6)
    assert "Linear was trained without a torch.optim optimizer (hand-written updates)" in notes


@pytest.mark.slow  # about 5 s (two reports)
def test_models_trained_in_two_threads_are_both_watched(
    tmp_path: Path, hookscope: Callable[..., object], capsys: pytest.CaptureFixture[str]
) -> None:
    expected = plain("two_threads.py", [], capsys)
    printed, results, _ = watched("two_threads.py", [], tmp_path / "out", hookscope)
    assert printed == expected
    assert sorted(results) == ["Linear", "Sequential"]
    for name, line in (("Sequential", "left"), ("Linear", "right")):
        losses = numbers(r"(\d+\.\d+)", next(row for row in printed.splitlines() if row.startswith(line)))
        assert results[name].steps.tolist() == [0, 1, 2, 3] and results[name].losses is not None
        torch.testing.assert_close(results[name].losses, losses, rtol=1e-5, atol=1e-6)
