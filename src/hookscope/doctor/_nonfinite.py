"""Non-finite values with provenance: the first layer whose output (forward) or output gradient (backward) broke.

`WatchResults.first_nonfinite` names the first module in execution order (kept on the device by `watch()`, read
once); when it is missing the per-layer `nonfinite` counts give the earliest step and, within it, the first
layer in forward order (forward) or the last (backward runs in reverse).
"""

from __future__ import annotations

import math

import torch

from ..results._results import WatchResults
from ._finding import Finding
from ._series import index_of_step, layer_order, module_of, previous_layer, step_at
from ._thresholds import Thresholds

__all__ = ["check_nonfinite_backward", "check_nonfinite_forward"]

Origin = tuple[str, int, str]  # (path, step, how it was found)


def _from_series(results: WatchResults, counts: dict[str, torch.Tensor], backward: bool = False) -> Origin | None:
    """The earliest step with a non-finite count > 0 and its first layer in forward (last in backward) order."""
    order = layer_order(results)
    rank = {path: i for i, path in enumerate(order)}
    hits = []
    for path, values in counts.items():
        bad = (values.detach().to(torch.float64) > 0).nonzero()
        if bad.numel():
            position = rank.get(path, len(rank))
            hits.append((int(bad[0, 0]), -position if backward else position, path))
    if not hits:
        return None
    index, _, path = min(hits)
    return path, step_at(results, index), "per-step counts, forward order"


def _origin(results: WatchResults, direction: str) -> Origin | None:
    first = results.first_nonfinite.get(direction) if results.first_nonfinite else None
    if first:
        return str(first["path"]), int(first["step"]), "execution order"
    if direction == "forward":
        return _from_series(results, {p: s["nonfinite"] for p, s in results.activations.items() if "nonfinite" in s})
    found = _from_series(results, {p: s["nonfinite"] for p, s in results.output_grads.items() if "nonfinite" in s})
    if found is not None:
        return found
    per_module = {module_of(n): s["nonfinite"] for n, s in results.param_grads.items() if "nonfinite" in s}
    return _from_series(results, per_module, backward=True)


def _count(results: WatchResults, group: dict[str, dict[str, torch.Tensor]], path: str, step: int) -> float | None:
    index = index_of_step(results, step)
    values = group.get(path, {}).get("nonfinite")
    if index is None or values is None or index >= values.numel():
        return None
    value = float(values[index])
    return value if math.isfinite(value) else None


def _first_bad_loss(results: WatchResults) -> tuple[int, float, bool] | None:
    """The first step whose logged loss is NaN/Inf: (step, loss, whether the step was measured), or `None`.

    Measured steps' losses (`losses`) and every step's (`logged_steps`, measured or not) are both read."""
    hits: list[tuple[int, float, bool]] = []
    if results.losses is not None:
        bad = (~torch.isfinite(results.losses) & results.loss_logged()).nonzero()  # an unknown loss is not NaN
        if bad.numel():
            index = int(bad[0, 0])
            hits.append((step_at(results, index), float(results.losses[index]), True))
    if results.logged_steps is not None and results.logged_losses is not None:
        bad = (~torch.isfinite(results.logged_losses)).nonzero()
        if bad.numel():
            step = int(results.logged_steps[int(bad[0, 0])])
            hits.append((step, float(results.logged_losses[int(bad[0, 0])]), step in set(results.steps.tolist())))
    return min(hits, key=lambda hit: (hit[0], not hit[2])) if hits else None


def _loss_finding(hit: tuple[int, float, bool]) -> list[Finding]:
    step, loss, measured = hit
    message = (
        "the loss became NaN/Inf while every watched layer output stayed finite"
        if measured
        else "the loss became NaN/Inf in a step that was not measured (its layer outputs were not watched)"
    )
    advice = (
        "The loss computation itself breaks: check log/division of predictions or targets (use "
        "log_softmax/BCEWithLogits), and the targets for NaN."
    )
    if not measured:
        advice += " To see which layer broke first, run again with watch(..., every=1) around that step."
    return [Finding("nonfinite_forward", "error", None, step, message, {"direction": "forward", "loss": loss}, advice)]


def check_nonfinite_forward(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """Name the first module whose output became NaN/Inf (or the loss, when no layer output did)."""
    origin, loss = _origin(results, "forward"), _first_bad_loss(results)
    if loss is not None and (origin is None or (loss[0] < origin[1] and not loss[2])):
        return _loss_finding(loss)  # no layer broke, or the loss broke first, in a step not measured
    if origin is None:
        return []
    path, step, source = origin
    kind = results.layers.get(path, "module")
    count = _count(results, results.activations, path, step)
    values = "" if count is None else f" ({count:.0f} values)"
    before = previous_layer(results, path)
    between = f" or an unwatched module/op between {before!r} and it" if before else " or an unwatched op before it"
    return [
        Finding(
            "nonfinite_forward",
            "error",
            path,
            step,
            f"first watched layer in forward order whose output became NaN/Inf{values}",
            {"direction": "forward", "nonfinite": count, "source": source, "layer_type": kind},
            f"This {kind}{between} turns finite values into NaN/Inf: look for log/sqrt/division of values <= 0, "
            "fp16 overflow or huge weights; torch.autograd.detect_anomaly() names the exact op.",
        )
    ]


def check_nonfinite_backward(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """Name the first module whose output gradient became NaN/Inf, unless a forward NaN came first."""
    origin = _origin(results, "backward")
    if origin is None:
        return []
    path, step, source = origin
    forward = _origin(results, "forward")
    if forward is not None and forward[1] <= step:
        return []  # the gradient of a non-finite forward: nothing new to say
    count = _count(results, results.output_grads, path, step)
    return [
        Finding(
            "nonfinite_backward",
            "error",
            path,
            step,
            "gradient of this layer's output became NaN/Inf first in backward (the forward was finite)",
            {"direction": "backward", "nonfinite": count, "source": source},
            "The backward of what follows this layer (or of the loss) produced it: look for sqrt/norm at 0, "
            "pow/exp overflow or fp16 gradients without a GradScaler; clip gradients.",
        )
    ]
