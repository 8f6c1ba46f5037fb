"""Real architectures end to end: summary, watch() over real training steps, the doctor, terminal tables.

GPT-2, BERT, ViT, ResNet and MobileNetV2 from `transformers` configs; torchvision-style ResNet, MobileNetV3 and
ViT written out; an LSTM language model and an nn.Transformer (see `zoo.py`, `blocks.py`). The healthy runs are
trained once per process (`zoo.healthy`) and shared with the report tests.
"""

from __future__ import annotations

import io

import pytest
import torch

from hookscope.doctor import Finding, diagnose, format_findings
from hookscope.summary import summary

from .zoo import MODELS, NAN_STEP, STEPS, build, expected_layers, faulty, healthy

NAMES = list(MODELS)
SLOWEST = {"gpt2": 10.6, "tv_mobilenet_v3": 5.6, "mobilenet_v2": 5.4}
"""Seconds of their slowest test here (`pytest --durations`, 2 workers): marked slow; they still run in `make test`."""
MARKED = [pytest.param(name, marks=pytest.mark.slow) if name in SLOWEST else name for name in NAMES]
WIDTHS = (80, 100, 160)


def widest(text: str) -> int:
    return max(map(len, text.splitlines()))


@pytest.mark.parametrize("name", MARKED)
def test_summary_counts_every_parameter_once_and_fits_the_terminal(name: str) -> None:
    rich_console = pytest.importorskip("rich.console")
    spec = MODELS[name]
    model = build(spec)
    args, kwargs, _ = spec.batch(torch.Generator().manual_seed(0))
    table = summary(model, *args, **kwargs)
    assert table.total_params == sum(p.numel() for p in model.parameters())  # shared ones (GPT-2's) once
    for width in WIDTHS:
        out = io.StringIO()
        rich_console.Console(file=out, width=width, color_system=None).print(table)
        assert widest(out.getvalue()) <= width, name
        assert widest(table.to_text(width=width)) <= width, name
    assert widest(table.to_text()) > 100  # the natural table is wider than a terminal: the test means something


@pytest.mark.parametrize("name", MARKED)
def test_a_healthy_run_records_every_selected_layer_warns_nothing_and_the_doctor_is_silent(name: str) -> None:
    run = healthy(name)
    results = run.results
    assert [str(w.message) for w in run.warnings] == []
    assert results.num_steps == STEPS and list(results.layers) == expected_layers(run.model)
    for path in results.layers:
        assert (results.activations[path]["count"] > 0).all(), path  # observed at every step
        assert torch.isfinite(results.activations[path]["mean"]).all(), path
        assert torch.isfinite(results.output_grads[path]["norm"]).all(), path
    for param, _ in run.model.named_parameters():
        assert torch.isfinite(results.param_grads[param]["norm"]).all(), param
        ratios = results.update_ratios[param]  # AdamW moves every parameter at every step ...
        assert (ratios[1:] > 0).all() and ratios[0] >= 0, param  # ... 0 for a zero init behind a zero head (0/0)
    assert results.losses is not None and results.losses[-5:].mean() < results.losses[:5].mean()  # it learns
    findings = diagnose(results)
    assert findings == [], format_findings(findings)


def only(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


@pytest.mark.parametrize("name", MARKED)
def test_a_nan_written_into_one_layer_is_blamed_on_that_layer_at_that_step(name: str) -> None:
    findings = diagnose(faulty(name, "nan").results)
    first = findings[0]
    assert (first.check, first.severity, first.path, first.step) == (
        "nonfinite_forward", "error", MODELS[name].nan_layer, NAN_STEP
    ), format_findings(findings)  # fmt: skip


@pytest.mark.parametrize("name", MARKED)
def test_a_dead_block_is_found_at_its_activation(name: str) -> None:
    spec = MODELS[name]
    run = faulty(name, "dead")
    findings = diagnose(run.results)
    first = findings[0]
    assert (first.check, first.severity, first.path) == ("dead_units", "error", spec.dead[1]), format_findings(findings)
    activity = run.results.unit_activity[spec.dead[1]]
    assert first.evidence["never"] == first.evidence["units"] == int((activity == 0).sum()) == activity.numel()


@pytest.mark.parametrize("name", MARKED)
def test_a_learning_rate_100_times_too_high_is_found_from_the_first_steps(name: str) -> None:
    findings = diagnose(faulty(name, "lr").results)
    (found,) = only(findings, "lr_too_high")
    assert found.path is None and found.step is not None and found.step <= 1, format_findings(findings)
    assert float(found.evidence["median_ratio"]) >= 0.1  # the evidence is what the healthy run never reaches


@pytest.mark.parametrize("width", WIDTHS)
def test_results_summaries_and_findings_of_real_models_fit_the_terminal(width: int) -> None:
    for name in ("bert", "tv_vit", "transformer"):
        results = healthy(name).results
        assert widest(results.summary(width=width, max_layers=100)) <= width
        findings = diagnose(faulty(name, "dead").results) + diagnose(faulty(name, "nan").results)
        assert widest(format_findings(findings, width=width)) <= width


def test_a_nan_made_between_two_calls_of_a_shared_relu_is_blamed_on_its_maker() -> None:
    """torchvision's BasicBlock calls its `relu` twice; a NaN made by `conv2`, between the two calls, is named at
    `conv2`: the shared module is ranked by its first call whose output was not finite (`CallLog`)."""
    from dataclasses import replace

    from . import zoo

    spec = replace(MODELS["tv_resnet"], nan_layer="layer2.0.conv2")
    findings = diagnose(zoo.train(spec, steps=zoo.FAULT_STEPS["nan"], fault="nan").results)
    assert (findings[0].check, findings[0].path) == ("nonfinite_forward", "layer2.0.conv2")
