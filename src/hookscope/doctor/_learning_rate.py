"""Learning rate too high or too low, read from update-to-weight ratios `||dW|| / ||W||` (guide: ~1e-3).

Only weight tensors count: biases (often zero-initialized, so their ratio means little) and tensors that were
never updated (frozen, or outside the optimizer) are left out, and a ratio of exactly 0 is a step not taken
(a skipped AMP step), not a small one.
"""

from __future__ import annotations

import torch

from ..results import WatchResults
from ._finding import Finding
from ._series import first_index, step_at, table
from ._thresholds import Thresholds

__all__ = ["check_lr_too_high", "check_lr_too_low"]


def _weight_ratios(results: WatchResults) -> tuple[list[str], torch.Tensor]:
    """Names and (P, S) ratios of the updated weight tensors, NaN where no step was taken."""
    names = [n for n in results.update_ratios if n.rpartition(".")[2] != "bias"]
    ratios = table([results.update_ratios[n] for n in names])
    ratios[ratios <= 0] = float("nan")
    keep = torch.isfinite(ratios).any(1)
    return [n for n, k in zip(names, keep.tolist(), strict=True) if k], ratios[keep]


def check_lr_too_high(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """Report the first recorded step at which most weights moved by `lr_high_ratio` of their norm or more."""
    names, ratios = _weight_ratios(results)
    if not names:
        return []
    observed = torch.isfinite(ratios).sum(0)
    high = (ratios >= thresholds.lr_high_ratio).sum(0)
    share = high / observed.clamp(min=1)
    index = first_index((observed > 0) & (share >= thresholds.lr_layer_fraction))
    if index is None:
        return []
    column = ratios[:, index]
    worst = int(column.nan_to_num(-1.0).argmax())
    median = float(column.nanmedian())
    return [
        Finding(
            "lr_too_high",
            "warning",
            None,
            step_at(results, index),
            f"one optimizer step changed {float(share[index]):.0%} of the weight tensors by >= "
            f"{thresholds.lr_high_ratio:g} of their norm (median {median:.2g}, guide ~1e-3)",
            {
                "median_ratio": median,
                "fraction": float(share[index]),
                "weights": int(observed[index]),
                "max_ratio": float(column[worst]),
                "max_parameter": names[worst],
            },
            "Lower the learning rate (by about median/1e-3), add warm-up, or clip gradients.",
        )
    ]


def check_lr_too_low(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """Report when most weights' median update ratio is at or below `lr_low_ratio` (steps too small to learn)."""
    _, ratios = _weight_ratios(results)
    enough = torch.isfinite(ratios).sum(1) >= min(thresholds.window, max(results.num_steps, 1))
    if not bool(enough.any()):
        return []
    medians = ratios[enough].nanmedian(1).values
    share = float((medians <= thresholds.lr_low_ratio).double().mean())
    if share < thresholds.lr_layer_fraction:
        return []
    median = float(medians.median())
    return [
        Finding(
            "lr_too_low",
            "warning",
            None,
            step_at(results, results.num_steps - 1),
            f"{share:.0%} of the weight tensors move by <= {thresholds.lr_low_ratio:g} of their norm per step "
            f"(median {median:.2g}, guide ~1e-3)",
            {"median_ratio": median, "fraction": share, "weights": int(enough.sum())},
            "Raise the learning rate (by about 1e-3/median) or check that the scheduler has not decayed it to ~0.",
        )
    ]
