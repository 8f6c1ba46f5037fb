"""Learning rate too high or too low, read from update-to-weight ratios `||dW|| / ||W||` (guide: ~1e-3).

Only weight tensors count: biases (often zero-initialized, so their ratio means little) and tensors that were
never updated (frozen, or outside the optimizer) are left out, and a ratio of exactly 0 is a step not taken
(a skipped AMP step), not a small one.
"""

from __future__ import annotations

import torch

from ..results._results import WatchResults
from ._finding import Finding
from ._series import first_index, step_at, table, windowed_median
from ._thresholds import Thresholds

__all__ = ["check_lr_too_high", "check_lr_too_low", "loss_falls"]


def _weight_ratios(results: WatchResults) -> tuple[list[str], torch.Tensor]:
    """Names and (P, S) ratios of the updated weight tensors, NaN where no step was taken."""
    names = [n for n in results.update_ratios if n.rpartition(".")[2] != "bias"]
    ratios = table([results.update_ratios[n] for n in names])
    ratios[ratios <= 0] = float("nan")
    keep = torch.isfinite(ratios).any(1)
    return [n for n, k in zip(names, keep.tolist(), strict=True) if k], ratios[keep]


def _most(share: torch.Tensor, thresholds: Thresholds) -> torch.Tensor:
    """Where `share` is more than `lr_layer_fraction` (or is everything)."""
    return (share > thresholds.lr_layer_fraction) | (share >= 1)


def check_lr_too_high(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """Report the first recorded steps from which most weights moved by `lr_high_ratio` of their norm or more
    (as a median over `window` consecutive recorded steps), unless the loss fell steadily meanwhile.

    Big steps whose loss falls steadily are a learning rate that works, not one too high: LBFGS's closure steps
    (each one many iterations and a line search), Adam on a small output layer, a tiny model fitting quickly. So
    when the loss was logged the finding needs the loss not to fall steadily as well (see `loss_falls`).
    """
    names, ratios = _weight_ratios(results)
    if not names:
        return []
    sustained = windowed_median(ratios, thresholds.window)
    observed = torch.isfinite(sustained).sum(0)
    high = (sustained >= thresholds.lr_high_ratio).sum(0)
    share = high / observed.clamp(min=1)
    index = first_index((observed > 0) & _most(share, thresholds))
    if index is None or loss_falls(results, thresholds):
        return []
    column = sustained[:, index]
    worst = int(column.nan_to_num(-1.0).argmax())
    median = float(column.nanmedian())
    return [
        Finding(
            "lr_too_high",
            "warning",
            None,
            step_at(results, index),
            f"optimizer steps changed {float(share[index]):.0%} of the weight tensors by >= "
            f"{thresholds.lr_high_ratio:g} of their norm (median {median:.2g} over {_steps(results, thresholds)}, "
            "guide ~1e-3)",
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


def _steps(results: WatchResults, thresholds: Thresholds) -> str:
    count = min(thresholds.window, max(results.num_steps, 1))
    return "1 step" if count == 1 else f"{count} steps"


def loss_falls(results: WatchResults, thresholds: Thresholds) -> bool:
    """Whether the logged loss fell steadily: positive, known at most recorded steps, its median over the last
    `window` recorded steps at most `stalled_loss_fraction` of its median over the first `window`, and its
    median over any `window` recorded steps never above the first loss recorded (no spike or divergence on the
    way: a learning rate too high often makes the loss jump at once, then fall back)."""
    if results.losses is None or results.losses.numel() < 2 * thresholds.window:
        return False
    losses = table([results.losses])[0]
    known = torch.isfinite(losses)
    if float(known.double().mean()) < 0.5 or bool((losses[known] <= 0).any()):
        return False
    medians = windowed_median(losses, thresholds.window)
    first = losses[known][0]
    fell = bool(medians[-1] <= thresholds.stalled_loss_fraction * medians[0])
    return fell and bool((medians[torch.isfinite(medians)] <= first).all())


def check_lr_too_low(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """Report when most weights' median update ratio is at or below `lr_low_ratio` (steps too small to learn)."""
    _, ratios = _weight_ratios(results)
    enough = torch.isfinite(ratios).sum(1) >= min(thresholds.window, max(results.num_steps, 1))
    if not bool(enough.any()):
        return []
    medians = ratios[enough].nanmedian(1).values
    share = float((medians <= thresholds.lr_low_ratio).double().mean())
    if not bool(_most(torch.tensor(share), thresholds)):
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
