"""Bad initialization: activation std collapsing or blowing up layer by layer at step 0; unobserved layers.

Layers are read in forward order. A normalization or softmax layer rescales by design, so it restarts the run
and is not itself compared; layers with zero or unknown std (zero-initialized, dead, not observed) are skipped.
"""

from __future__ import annotations

import math

from ..results._results import WatchResults
from ._finding import Finding
from ._series import layer_order
from ._thresholds import Thresholds

__all__ = ["check_bad_init", "check_unobserved"]

_ADVICE = {
    "collapse": "Weights start too small for this depth: use Kaiming init (ReLU family) or Xavier init "
    "(tanh/sigmoid), or add normalization layers.",
    "blow-up": "Weights start too large: use Kaiming/Xavier init (std ~ 1/sqrt(fan_in)), or add normalization layers.",
}


def _segments(results: WatchResults) -> list[list[tuple[str, float]]]:
    """Runs of (path, std at the first step) in forward order, cut at normalization and softmax layers."""
    segments: list[list[tuple[str, float]]] = [[]]
    for path in layer_order(results):
        kind = results.layers.get(path, "")
        if "Norm" in kind or "Softmax" in kind:
            segments.append([])
            continue
        std = results.activations.get(path, {}).get("std")
        value = float(std[0]) if std is not None and std.numel() else math.nan
        if math.isfinite(value) and value > 0:
            segments[-1].append((path, value))
    return segments


def _scan(segment: list[tuple[str, float]], t: Thresholds) -> tuple[str, int, int] | None:
    """The first (direction, from index, index) where std fell from the peak or rose from the trough so far.

    A collapse must build up: the layer before had already fallen by sqrt(`init_std_change`), so a single
    deliberately small layer (a small-init head) is not blamed.
    """
    peak = trough = 0
    for i in range(1, len(segment)):
        std, before = segment[i][1], segment[i - 1][1]
        if segment[peak][1] / std >= t.init_std_change and segment[peak][1] / before >= math.sqrt(t.init_std_change):
            return "collapse", peak, i
        if std / segment[trough][1] >= t.init_std_change:
            return "blow-up", trough, i
        peak = i if std > segment[peak][1] else peak
        trough = i if std < segment[trough][1] else trough
    return None


def check_bad_init(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """Report the first layer where activation std at step 0 collapsed or blew up by `init_std_change`."""
    if results.num_steps == 0 or int(results.steps[0]) != 0:
        return []
    for segment in _segments(results):
        hit = _scan(segment, thresholds)
        if hit is None:
            continue
        direction, begin, end = hit
        (first, std_first), (path, std) = segment[begin], segment[end]
        factor = std_first / std if direction == "collapse" else std / std_first
        verb = "falls" if direction == "collapse" else "grows"
        return [
            Finding(
                "bad_init",
                "warning",
                path,
                0,
                f"activation std {verb} {factor:.2g}x from {first!r} ({std_first:.3g}) to here ({std:.3g}) over "
                f"{end - begin} layers at step 0",
                {"direction": direction, "factor": factor, "from_layer": first, "from_std": std_first, "std": std},
                _ADVICE[direction],
            )
        ]
    return []


def check_unobserved(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """List the selected modules that never fired (their statistics are missing, not zero)."""
    return [
        Finding(
            "unobserved",
            "info",
            path,
            None,
            "selected but never observed, so no check could look at it",
            {"reason": reason},
            reason,
        )
        for path, reason in results.unobserved.items()
    ]
