"""`Thresholds`: every number the built-in checks compare against, named, documented and validated."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .._errors import closest_names
from ..results._activity import DEAD_UNIT_ACTIVITY

__all__ = ["Thresholds"]

_FRACTIONS = (
    "lr_layer_fraction", "dead_unit_activity", "dead_unit_fraction", "saturation_fraction", "identical_unit_fraction",
    "attention_entropy_floor", "attention_sink_share", "epsilon_layer_fraction",
)  # fmt: skip
_COUNTS = ("window", "loss_spike_window")
_RATIOS = (
    "grad_depth_ratio", "grad_step_ratio", "init_std_change", "attention_logit_growth", "massive_ratio",
    "loss_spike_ratio",
)  # fmt: skip


@dataclass(frozen=True)
class Thresholds:
    """The thresholds of the built-in checks; pass overrides to `diagnose(..., name=value)` or build one.

    Defaults are chosen so that a healthy small model trained normally raises no warning (see the tests) while
    each planted fault does. "Orders of magnitude" in the issue became 1e3 (three decades).

    Attributes:
        window: recorded steps a condition must hold for (as a median over consecutive recorded steps) before it
            is reported, and the number of first recorded steps that form a baseline; single noisy steps are
            ignored. Runs shorter than `window` use all their steps.
        grad_depth_ratio: output-gradient norms of a layer this many times larger (exploding) or smaller
            (vanishing) than those of the layer of the same kind nearest the loss, at the same step (a kind: one
            module type at one place in repeated blocks, `hookscope.doctor._gradients.layer_kind`). Vanishing is
            reported only where the weights it reaches also stall: update ratios at or below `lr_low_ratio`, or
            this many times below the model's median weight (when update ratios were recorded).
        grad_step_ratio: a layer's gradient norm this many times larger (exploding) or smaller (vanishing)
            than its own median over the first `window` recorded steps. Vanishing over steps is only reported
            when the loss was logged and has stalled (see `stalled_loss_fraction`): shrinking gradients are
            what convergence looks like.
        stalled_loss_fraction: the loss counts as stalled while it is above this fraction of its median over
            the first `window` recorded steps.
        lr_high_ratio: update-to-weight ratio `||dW|| / ||W||` at or above which optimizer steps are too big
            (a tenth of the weight rewritten per step; the usual guide is ~1e-3, this is two decades above), as a
            median over `window` recorded steps, and only while the loss does not fall steadily (big steps that
            keep lowering the loss, as LBFGS's, work; see `hookscope.doctor._learning_rate.loss_falls`).
        lr_low_ratio: median update-to-weight ratio at or below which the steps are too small to learn (two
            decades below ~1e-3). Adam moves each weight by about `lr`, so this flags Adam only below ~1e-6.
        lr_layer_fraction: the learning rate (global) is blamed when more than this share of the weight
            tensors (biases and never-updated tensors left out; all of them for 1) are past `lr_high_ratio` or
            `lr_low_ratio`. More than half by default: with two weight tensors, both (Adam moves a small output
            layer by a large share of its norm while the other layers move little, as in REINFORCE on CartPole),
            and the median the finding quotes is then past the threshold too.
        dead_unit_activity: a unit of a ReLU-family layer active (> 0) less than this fraction of the time over
            all recorded steps counts as dead (it passes almost no gradient); the unit-activity plot counts the
            same way (`hookscope.results._activity`).
        dead_unit_fraction: the share of a ReLU-family layer's units that are dead (see `dead_unit_activity`) at
            which the layer is reported: a warning, an error when every unit was never active at all.
        saturation_fraction: the share of a tanh/sigmoid-family output within 1% of its bounds (the
            `saturated` statistic) at which the layer is reported.
        identical_unit_fraction: the share of a layer's output units identical to another unit (read from the
            weights) at which symmetry counts as not broken (an error when every unit is identical).
        init_std_change: at step 0, activation std falling (collapse) from the largest std of the layers before
            it, or rising (blow-up) from the smallest, by this factor. A collapse must build up over layers (the
            layer before had already fallen by the square root of the factor), so a single deliberately small
            layer such as a small-init head is not blamed. Normalization and softmax layers rescale by design:
            they restart the comparison.
        attention_logit_limit: a layer's largest pre-softmax attention logit (windowed median) past which its
            growth is reported (Wortsman et al. 2023: every run with logits above 1e4 diverged; healthy runs of the
            tiny test decoder stay below about 350, its LR 0.1 run passes 1e3 within 60 steps).
        attention_logit_growth: ...and only when it grew this many times above its median over the first
            `window` recorded steps; the first step past this factor is where the growth began (the finding's
            step).
        attention_entropy_floor: a head's attention entropy (as a fraction of its maximum, `log(keys)`) below
            which it counts as collapsed (as a median over `window` recorded steps); reported only where the
            layer's max logit is out of bounds too, or where every head of the layer fell below it within the
            learning-rate warmup (the recorded steps over which the optimizer's learning rate rose from the first;
            unknown, so never, without an optimizer watched). A healthy run whose heads all sharpen by design
            before a long warmup ends is reported too: the tiny test decoder at LR 3e-2 makes both heads of its
            first layer one-hot around step 46 (after a 30-step warmup: silent), or at step 79 on a 1000-step
            schedule (within its 100-step warmup: reported, although it learns).
        attention_sink_share: a head's mean attention share on the first key above which it is an attention
            sink (informational).
        massive_magnitude: a residual-stream value larger than this (Sun et al. 2024: 100)...
        massive_ratio: ...and this many times the median magnitude of its hidden state is a massive activation.
        epsilon_layer_fraction: the share of weight tensors whose gradient RMS is below the optimizer's epsilon
            (over `window` recorded steps) at which the epsilon is reported as too large.
        loss_spike_window: the losses that must all stay above every one of the twice as many before them for
            a jump to count as a loss spike that lasts.
        loss_spike_ratio: ...and their median must be this many times the median before (the signal that jumped
            first must have risen twice this factor).
    """

    window: int = 3
    grad_depth_ratio: float = 1e3
    grad_step_ratio: float = 1e3
    stalled_loss_fraction: float = 0.5
    lr_high_ratio: float = 1e-1
    lr_low_ratio: float = 1e-5
    lr_layer_fraction: float = 0.5
    dead_unit_activity: float = DEAD_UNIT_ACTIVITY
    dead_unit_fraction: float = 0.25
    saturation_fraction: float = 0.5
    identical_unit_fraction: float = 0.1
    init_std_change: float = 1e3
    attention_logit_limit: float = 1e3
    attention_logit_growth: float = 10.0
    attention_entropy_floor: float = 0.05
    attention_sink_share: float = 0.5
    massive_magnitude: float = 100.0
    massive_ratio: float = 1e3
    epsilon_layer_fraction: float = 0.5
    loss_spike_window: int = 10
    loss_spike_ratio: float = 1.25

    def __post_init__(self) -> None:
        for name in _COUNTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if item.name in _COUNTS:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{item.name} must be a finite number > 0, got {value!r}")
        for name in (*_FRACTIONS, "stalled_loss_fraction"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name} must be a fraction in (0, 1], got {getattr(self, name)!r}")
        for name in _RATIOS:
            if getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a factor > 1, got {getattr(self, name)!r}")
        if self.lr_low_ratio >= self.lr_high_ratio:
            raise ValueError(
                f"lr_low_ratio must be below lr_high_ratio, got {self.lr_low_ratio!r} >= {self.lr_high_ratio!r}"
            )

    def replace(self, **overrides: Any) -> Thresholds:
        """Return a copy with some thresholds changed (validated).

        Raises:
            ValueError: a name is not a threshold (the closest names are listed) or a value is out of range.
        """
        names = [item.name for item in dataclasses.fields(self)]
        for name in overrides:
            if name not in names:
                close = ", ".join(repr(c) for c in closest_names(name, names, n=3))
                raise ValueError(
                    f"threshold names must be fields of Thresholds, got {name!r}."
                    f" Closest: {close or 'none'}. All: {', '.join(names)}."
                )
        return dataclasses.replace(self, **overrides)
