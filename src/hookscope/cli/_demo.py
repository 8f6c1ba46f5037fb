"""`hookscope demo`: train the digits CNN with a progress bar, print what hookscope saw, write the report."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch.nn as nn

from ..demo._model import FAULTS
from ..demo._train import DemoConfig, DemoRun, train_demo

__all__ = ["run_demo"]


def run_demo(out: Path, epochs: int, fault: str | None, console: Any) -> int:
    """Run the demo, print it to `console` (a rich Console), write the report into `out`; return 0."""
    from ..doctor._diagnose import diagnose
    from ..doctor._finding import format_findings
    from ..report import write_report

    started = time.perf_counter()
    config = DemoConfig(epochs=epochs, fault=fault)
    console.print("[bold]hookscope demo[/]: a small CNN learns scikit-learn's bundled 8x8 handwritten digits")
    if fault:
        console.print(f"[bold red]planted fault[/] {fault}: {FAULTS[fault].description}")
    run, model_summary = _train(config, console)
    console.print(
        f"held-out accuracy: [bold]{run.accuracy:.1%}[/] on {run.test_size} images after {epochs} epochs "
        f"({run.seconds:.1f} s of training)"
    )
    console.print(_layer_table(run, console.width))
    findings = diagnose(run.results)
    console.print(format_findings(findings, width=max(console.width, 40)), markup=False, highlight=False)
    meta = {"model": "DigitsCNN", "command": _command(epochs, fault), "epochs": epochs, "fault": fault or "none"}
    meta.update(accuracy=round(run.accuracy, 4), learning_rate=run.lr, train_seconds=round(run.seconds, 2))
    page = write_report(out, run.results, summary=model_summary, findings=findings, meta=meta, weights=run.model)
    console.print(f"report: [bold]{page}[/] (demo took {time.perf_counter() - started:.1f} s)")
    return 0


def _train(config: DemoConfig, console: Any) -> tuple[DemoRun, Any]:
    """Train under a progress bar; print the model's summary before the first batch."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..summary._api import summary

    summaries: list[Any] = []

    def show_summary(model: nn.Module) -> None:
        summaries.append(summary(model, input_size=(config.batch_size, 1, 8, 8), progress=False))  # a bar is shown
        if console.is_terminal:
            console.print(summaries[0])
        else:  # plain text at full width: a pipe or a log file gets no 80-column folding
            console.print(summaries[0].to_text(), soft_wrap=True, markup=False, highlight=False)

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("training", total=None)

        def advance(done: int, total: int, loss: float | None) -> None:
            epoch = f"epoch {math.ceil(done * config.epochs / total)}/{config.epochs}"
            description = f"{epoch} loss {loss:.3f}" if loss is not None else None
            progress.update(task, completed=done, total=total, description=description)

        run = train_demo(config, advance, show_summary)
    return run, summaries[0] if summaries else None


def _command(epochs: int, fault: str | None) -> str:
    flags = (f" --epochs {epochs}" if epochs != DemoConfig.epochs else "") + (f" --fault {fault}" if fault else "")
    return f"hookscope demo{flags}"


def _layer_table(run: DemoRun, width: int) -> Any:
    """Each weighted layer at the last batch: ActivationStats' mean/std/% near zero (its own rule, `x <= 0.05`),
    the update/weight ratio; layer paths shortened in the middle to a third of the console's `width`."""
    from rich.table import Table

    from .._text import display_name
    from ..plot._base import near_zero_caption

    table = Table(
        title="at the last batch", caption="activations: ActivationStats; update/weight: weight update monitor"
    )
    caption = near_zero_caption(run.activation_stats.near_zero, signed=True)
    for name in ("layer", "mean", "std", caption, "update / weight"):
        table.add_column(name, justify="left" if name == "layer" else "right", no_wrap=name == "layer")
    stats, history = run.activation_stats, run.updates.get("update_history", {})
    for index, path in enumerate(stats.paths):
        means, stds, near = (float(series[-1]) for series in stats.layer_stats(index))
        ratio = float((history.get(f"{path}.weight") or [math.nan])[-1])
        shown = display_name(path, max(width // 3, 12))
        table.add_row(shown, f"{means:.3f}", f"{stds:.3f}", f"{near:.0%}", f"{ratio:.1e}")
    return table
