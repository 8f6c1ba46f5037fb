"""`hookscope run` on the scripts people really write (tests/cli/scripts): a Hugging Face GPT-2 trained with
`labels=`, a model that returns its own loss, a GAN, a run that ends mid-accumulation, a script that changes its
working directory, a long run. Each runs bare (`python script.py`, the oracle) and under `python -m hookscope run`,
both in subprocesses: the same stdout and exit code, every optimizer step recorded from step 0 with the loss the
script printed, and no false finding. One run of each script serves all its checks (cached per test process)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from hookscope.results import WatchResults

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@dataclass
class Runs:
    """One script run bare and under `hookscope run`; each watched model's results and report document."""

    bare: subprocess.CompletedProcess[str]
    watched: subprocess.CompletedProcess[str]
    out: Path
    results: dict[str, WatchResults] = field(default_factory=dict)
    documents: dict[str, dict] = field(default_factory=dict)


def python(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def load(out: Path) -> tuple[dict[str, WatchResults], dict[str, dict]]:
    folders = [out] if (out / "results.safetensors").exists() else sorted(p for p in out.iterdir() if p.is_dir())
    results, documents = {}, {}
    for folder in folders:
        document = json.loads((folder / "report.json").read_text())
        name = document["meta"]["model"]
        results[name], documents[name] = WatchResults.load(folder / "results.safetensors"), document
    return results, documents


@pytest.fixture(scope="session")
def script_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Runs]]:
    """`runs(script, *args, flags=())`: run once per test process, bare and watched, each in a fresh folder."""
    done: dict[tuple[str, ...], Runs] = {}

    def runs(script: str, *args: str, flags: tuple[str, ...] = ()) -> Runs:
        key = (script, *args, "|", *flags)
        if key not in done:
            bare_dir, watched_dir = tmp_path_factory.mktemp("bare"), tmp_path_factory.mktemp("watched")
            bare = python([str(SCRIPTS / script), *args], bare_dir)
            watched = python(["-m", "hookscope", "run", *flags, str(SCRIPTS / script), *args], watched_dir)
            runs = Runs(bare, watched, watched_dir / "hookscope-report")  # the default --out, where it started
            runs.results, runs.documents = load(runs.out)
            done[key] = runs
        return done[key]

    yield runs


def printed(pattern: str, text: str) -> torch.Tensor:
    return torch.tensor([float(value) for value in re.findall(pattern, text)], dtype=torch.float64)


CASES = {
    "hf_gpt2": ("hf_gpt2.py", (), "GPT2LMHeadModel"),
    "loss_in_forward": ("loss_in_forward.py", (), "Regressor"),
    "gan": ("dcgan.py", (), "Discriminator"),
    "accumulate": ("accumulate.py", (), "Sequential"),
    "chdir": ("chdir.py", (), "Sequential"),
    "long_run": ("long_run.py", ("300",), "Sequential"),
}
FLAGS = {"long_run": ("--capacity", "100")}  # 300 steps over a capacity of 100: the thinning of a long run, fast


def case(name: str, script_runs: Callable[..., Runs]) -> Runs:
    script, args, _ = CASES[name]
    return script_runs(script, *args, flags=FLAGS.get(name, ()))


@pytest.mark.slow  # each case: the script twice in a fresh interpreter, 3-8 s
@pytest.mark.parametrize("name", list(CASES))
def test_the_script_prints_the_same_and_exits_the_same(name: str, script_runs: Callable[..., Runs]) -> None:
    runs = case(name, script_runs)
    assert runs.bare.returncode == 0, runs.bare.stderr
    assert runs.watched.returncode == runs.bare.returncode, runs.watched.stderr
    assert runs.watched.stdout == runs.bare.stdout  # untouched: no status line off a terminal either
    last = runs.watched.stderr.strip().splitlines()[-1]  # where the page is, from where `hookscope run` started
    assert last == f"hookscope: report written to {Path('hookscope-report', 'report.html')}"
    assert CASES[name][2] in runs.results


# ---- every optimizer step from step 0, each with the loss the script printed -----------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "pattern"),
    [("hf_gpt2", r"step \d+: loss (\S+)"), ("loss_in_forward", r"step \d+: loss (\S+)"), ("chdir", r"loss (\S+)")],
)
def test_a_model_trained_with_its_own_loss_is_recorded_from_step_0(
    name: str, pattern: str, script_runs: Callable[..., Runs]
) -> None:
    runs = case(name, script_runs)
    (results,) = runs.results.values()
    losses = printed(pattern, runs.bare.stdout)
    assert results.steps.tolist() == list(range(len(losses)))
    assert results.losses is not None
    torch.testing.assert_close(results.losses, losses, rtol=1e-5, atol=1e-6)
    assert all(torch.isfinite(grads["norm"]).all() for grads in results.param_grads.values())


@pytest.mark.slow
def test_an_unfinished_accumulation_step_has_the_sum_of_its_micro_batch_losses(
    script_runs: Callable[..., Runs],
) -> None:
    runs = case("accumulate", script_runs)
    (results,) = runs.results.values()
    losses = printed(r"loss (\S+)", runs.bare.stdout)  # two steps, then the unfinished one
    assert results.steps.tolist() == [0, 1, 2]
    assert results.meta["step_labels"] == {"unfinished": [2]}
    assert results.losses is not None
    torch.testing.assert_close(results.losses, losses, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_each_gan_model_gets_its_own_losses_from_step_0(script_runs: Callable[..., Runs]) -> None:
    runs = case("gan", script_runs)
    assert sorted(runs.results) == ["Discriminator", "Generator"]
    for name, pattern in (("Discriminator", r"Loss_D: (\S+)"), ("Generator", r"Loss_G: (\S+)")):
        losses, results = printed(pattern, runs.bare.stdout), runs.results[name]
        assert results.steps.tolist()[: len(losses)] == list(range(len(losses))) and results.losses is not None
        torch.testing.assert_close(results.losses[: len(losses)], losses, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_long_run_keeps_its_first_and_last_steps_and_says_how_it_was_thinned(
    script_runs: Callable[..., Runs],
) -> None:
    runs = case("long_run", script_runs)
    (results,) = runs.results.values()
    losses = printed(r"loss (\S+)", runs.bare.stdout)
    kept = results.steps.tolist()
    assert kept[0] == 0 and kept[-1] == len(losses) - 1 and len(kept) <= 100
    assert results.losses is not None
    torch.testing.assert_close(results.losses, losses[results.steps], rtol=1e-5, atol=1e-6)
    page = (runs.out / "report.html").read_text()
    assert re.search(r"300 steps: every \d+(st|nd|rd|th) step kept", page), "the thinning is stated in words"


@pytest.mark.slow
def test_a_long_run_is_thinned_to_its_capacity_with_the_printed_losses(script_runs: Callable[..., Runs]) -> None:
    runs = case("long_run", script_runs)
    (results,) = runs.results.values()
    losses = printed(r"loss (\S+)", runs.bare.stdout)
    kept = results.steps.tolist()
    assert kept[0] == 0 and len(kept) <= 100 and kept == sorted(set(kept))  # --capacity 100 reached watch()
    assert results.meta["capacity"] == 100 and results.losses is not None
    torch.testing.assert_close(results.losses, losses[results.steps], rtol=1e-5, atol=1e-6)


# ---- no false finding ----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "hf_gpt2",
        "loss_in_forward",
        "chdir",
        "long_run",
        "gan",  # the discriminator's unfinished last step has no loss: unknown, not non-finite
        "accumulate",
    ],
)
def test_a_healthy_script_gets_no_finding(name: str, script_runs: Callable[..., Runs]) -> None:
    runs = case(name, script_runs)
    found = {model: document["findings"] for model, document in runs.documents.items()}
    assert found == {model: [] for model in runs.documents}, runs.watched.stderr


# ---- paths: __file__, the default --out and the script's chdir -------------------------------------------------
@pytest.mark.slow
def test_a_script_that_changes_directory_finds_its_files_and_the_report_stays_where_run_started(
    script_runs: Callable[..., Runs],
) -> None:
    runs = case("chdir", script_runs)
    assert "__file__ is absolute: True" in runs.watched.stdout and "labels: cat dog bird" in runs.watched.stdout
    started_in = runs.out.parent
    assert (started_in / "hookscope-report" / "report.html").is_file()  # not outputs/run-1/hookscope-report
    assert not (started_in / "outputs" / "run-1" / "hookscope-report").exists()


@pytest.mark.slow
def test_the_traceback_of_a_script_names_it_as_python_does(script_runs: Callable[..., Runs]) -> None:
    runs = script_runs("chdir.py", "--crash")
    assert runs.bare.returncode == runs.watched.returncode == 1
    traceback = runs.bare.stderr[runs.bare.stderr.index("Traceback") :]
    assert f'File "{SCRIPTS / "chdir.py"}"' in traceback  # absolute, as Python 3.9+ makes __main__'s __file__
    assert traceback in runs.watched.stderr
