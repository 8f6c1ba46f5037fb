"""The planted transformer runs of the doctor's transformer checks: the tiny decoder trained under `watch()`."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hookscope.demo import TinyGPT, TinyGPTConfig, tiny_gpt_optimizer, train_tiny_gpt
from hookscope.doctor import DiagnosisWarning, Finding, diagnose
from hookscope.results import WatchResults
from hookscope.watch import watch

GROUPS = ("attention", "residual", "param_grads", "optimizer")
"""What the transformer checks read (with the loss): the planted runs record only these, which keeps them fast."""

NEW_CHECKS = (
    "attention_logit_growth",
    "attention_entropy_collapse",
    "adam_epsilon_too_large",
    "loss_spike",
    "massive_activation",
    "attention_sink",
)


@dataclass
class Run:
    """What one planted run gave: its results, the findings of the transformer checks, its losses, and the step
    at which the live doctor first warned about each check."""

    results: WatchResults
    findings: list[Finding]
    losses: list[float]
    live: dict[str, int] = field(default_factory=dict)

    def named(self, check: str) -> list[Finding]:
        """The findings of `check`."""
        return [f for f in self.findings if f.check == check]

    def warnings(self, prefix: str = "") -> list[Finding]:
        """The warnings (not info) whose check starts with `prefix`."""
        return [f for f in self.findings if f.severity != "info" and f.check.startswith(prefix)]


def run(
    *,
    sdpa: bool,
    lr: float,
    qk_layernorm: bool = False,
    eps: float = 1e-8,
    seed: int = 0,
    doctor_every: int | None = None,
    plant: Callable[[TinyGPT], None] | None = None,
    **training: Any,
) -> Run:
    """Train the tiny decoder under `watch()` (`GROUPS`, the loss logged, the live doctor every `doctor_every`
    recorded steps if given) and diagnose the results; `plant` is called with the model before it trains (a fault
    planted by hooks)."""
    torch.manual_seed(seed)
    model = TinyGPT(TinyGPTConfig(sdpa=sdpa, qk_layernorm=qk_layernorm))
    if plant is not None:
        plant(model)
    optimizer = tiny_gpt_optimizer(model, lr, eps)
    options: dict[str, Any] = {"groups": GROUPS, "every": 1}  # every step measured: the onsets are exact
    if doctor_every is not None:
        options.update(doctor=True, doctor_every=doctor_every)
    live: dict[str, int] = {}
    with warnings.catch_warnings(record=True) as caught, watch(model, optimizer, **options) as w:
        warnings.simplefilter("always", DiagnosisWarning)

        def log(step: int, loss: torch.Tensor) -> None:
            w.log_loss(loss)
            for warning in caught:
                check = str(warning.message).partition("[")[2].partition("]")[0]
                live.setdefault(check, step)

        losses = train_tiny_gpt(model, optimizer, seed=seed, on_step=log, **training)
    results = w.results()
    findings = [f for f in diagnose(results) if f.check in NEW_CHECKS]
    return Run(results, findings, losses, live)
