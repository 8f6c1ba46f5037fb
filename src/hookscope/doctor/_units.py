"""Unit-level checks: dead ReLU units, saturated tanh/sigmoid outputs, units that never became different.

Dead units and saturation are read at the activation modules themselves (`nn.ReLU`, `nn.Tanh` ...), so those
modules must be among the watched ones; functional activations (`F.relu` inside a `forward`) cannot be seen.
"""

from __future__ import annotations

from ..results._activity import count_inactive_units
from ..results._results import WatchResults
from ._finding import Finding
from ._series import first_index, layer_order, module_of, previous_layer, step_at, table, windowed_median
from ._thresholds import Thresholds

__all__ = ["RELU_FAMILY", "can_die", "check_dead_units", "check_saturation", "check_symmetry"]

RELU_FAMILY = frozenset(
    {"ReLU", "ReLU6", "LeakyReLU", "PReLU", "RReLU", "ELU", "CELU", "SELU", "GELU", "SiLU", "Mish", "Hardswish"}
)
"""Module type names whose units can die: output never > 0, so (almost) no gradient flows back through them."""
_RELU_LIKE = ("ReLU", "GELU", "SiLU", "Swish", "Mish", "ELU")


def can_die(kind: str) -> bool:
    """Whether units of a module of type name `kind` can die: the `RELU_FAMILY`, and library activations and fused
    modules named after one of them (Hugging Face's `GELUActivation`, `NewGELUActivation`, a `ConvBNReLU` ...)."""
    return kind in RELU_FAMILY or any(key in kind for key in _RELU_LIKE)


def _saw_nonfinite(results: WatchResults, path: str) -> bool:
    counts = results.activations.get(path, {}).get("nonfinite")
    return counts is not None and bool((counts.nan_to_num(0.0) > 0).any())


def check_dead_units(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """Report ReLU-family layers where `dead_unit_fraction` of the units were active (> 0) less than
    `dead_unit_activity` of the time over the recorded steps (an error when every unit was never active)."""
    found = []
    for path, activity in results.unit_activity.items():
        if not can_die(results.layers.get(path, "")) or _saw_nonfinite(results, path):
            continue  # NaN is never > 0: after a non-finite output, inactivity says nothing
        counts = count_inactive_units(activity, thresholds.dead_unit_activity)
        if not counts.units or counts.fraction < thresholds.dead_unit_fraction:
            continue
        source = previous_layer(results, path)
        feeder = f"'{source}'" if source else "the layer before it"
        found.append(
            Finding(
                "dead_units",
                "error" if counts.never == counts.units else "warning",
                path,
                step_at(results, results.num_steps - 1),
                f"{counts.inactive} of {counts.units} units ({counts.fraction:.0%}) were active (> 0) < "
                f"{thresholds.dead_unit_activity:.0%} of the time over {results.num_steps} recorded steps, "
                f"{counts.never} of them never",
                {
                    "dead": counts.inactive,
                    "never": counts.never,
                    "units": counts.units,
                    "fraction": counts.fraction,
                    "activity_below": thresholds.dead_unit_activity,
                    "input_layer": source,
                },
                f"Their inputs stay negative: check the bias and initialization of {feeder} and lower the "
                "learning rate; LeakyReLU/GELU or normalization before the activation also help.",
            )
        )
    return found


def check_saturation(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """Report tanh/sigmoid-family layers whose `saturated` fraction reaches `saturation_fraction`.

    The last layer is judged only at the start: a trained classifier's output sigmoid is meant to sit near 0/1.
    ReLU-family modules (ReLU6) are left to `check_dead_units`.
    """
    order = layer_order(results)
    found = []
    for path, stats in results.activations.items():
        if "saturated" not in stats or can_die(results.layers.get(path, "")):
            continue  # ReLU6 sits at its lower bound whenever it is off: that is inactivity, not saturation
        medians = windowed_median(table([stats["saturated"]])[0], thresholds.window)
        hit = medians >= thresholds.saturation_fraction
        if order and path == order[-1]:
            hit = hit[:1]
        index = first_index(hit)
        if index is None:
            continue
        share, kind, source = float(medians[index]), results.layers.get(path, "module"), previous_layer(results, path)
        feeder = f"'{source}'" if source else "the layer before it"
        found.append(
            Finding(
                "saturation",
                "warning",
                path,
                step_at(results, index),
                f"{share:.0%} of this {kind}'s outputs sit within 1% of its bounds, where its gradient is ~0",
                {"fraction": share, "layer_type": kind, "input_layer": source},
                f"Its inputs are too large: shrink the weights of {feeder} (Xavier/Glorot init), normalize its "
                "inputs, or lower the learning rate.",
            )
        )
    return found


def _updated(results: WatchResults, path: str) -> bool:
    """Whether training moved the layer's parameters (or, with no update ratios for it, ran 2+ steps)."""
    ratios = [r for name, r in results.update_ratios.items() if module_of(name) == path]
    if not ratios:
        return results.num_steps >= 2
    values = table(ratios)
    return bool((values > 0).any())


def check_symmetry(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """Report layers where `identical_unit_fraction` of output units are still identical once training moved them."""
    found = []
    for path, identical in results.identical_units.items():
        activity = results.unit_activity.get(path)
        units = int(activity.numel()) if activity is not None else None
        share = identical / units if units else None
        if identical < 2 or (share is not None and share < thresholds.identical_unit_fraction):
            continue
        if not _updated(results, path):
            continue
        of = f" of {units}" if units else ""
        found.append(
            Finding(
                "symmetry",
                "error" if units is not None and identical >= units else "warning",
                path,
                step_at(results, results.num_steps - 1),
                f"{identical}{of} output units are identical to another unit after training started",
                {"identical": identical, "units": units, "fraction": share},
                "Identical units get identical gradients and never differ: initialize this layer randomly "
                "(torch's default, nn.init.kaiming_* or xavier_*), never with a constant.",
            )
        )
    return found
