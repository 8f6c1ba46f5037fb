"""Exploding and vanishing gradients: per-layer gradient norms that move by orders of magnitude.

Across depth, each layer's output-gradient norm is compared with that of the last layer (the one nearest the
loss) at the same step; over steps, with the layer's own median over the first recorded steps. Both are judged
on medians over `window` consecutive recorded steps. Output-gradient norms are used when `watch()` recorded
them, else parameter-gradient norms per module.
"""

from __future__ import annotations

import torch

from ..watch import WatchResults
from ._finding import Finding
from ._series import first_index, layer_order, module_of, step_at, table, windowed_median
from ._thresholds import Thresholds

__all__ = ["check_exploding_gradients", "check_vanishing_gradients"]

_ADVICE = {
    "exploding": "Clip gradients (torch.nn.utils.clip_grad_norm_), lower the learning rate, add normalization "
    "or residual connections, or shrink the initialization.",
    "vanishing": "Use ReLU-family activations with Kaiming init, normalization layers or residual connections; "
    "avoid deep stacks of saturating tanh/sigmoid.",
}


def gradient_table(results: WatchResults) -> tuple[list[str], torch.Tensor]:
    """Per-layer gradient norms in forward order: output gradients, else parameter gradients combined per module.

    Shape:
        (L, S) float64, NaN where not observed or not finite.
    """
    order = layer_order(results)
    if results.output_grads:
        paths = [p for p in order if "norm" in results.output_grads.get(p, {})]
        return paths, table([results.output_grads[p]["norm"] for p in paths])
    squares: dict[str, list[torch.Tensor]] = {}
    for name, stats in results.param_grads.items():
        if "norm" in stats:
            squares.setdefault(module_of(name), []).append(stats["norm"].to(torch.float64) ** 2)
    paths = sorted(squares, key=lambda p: order.index(p) if p in order else len(order))
    return paths, table([torch.stack(squares[p]).sum(0).sqrt() for p in paths])


def _times(ratio: float) -> str:
    return "0x (no gradient at all)" if ratio == 0 else f"{ratio:.2g}x"


def _reference_row(norms: torch.Tensor) -> int | None:
    usable = ((norms > 0) & torch.isfinite(norms)).any(1).nonzero()
    return int(usable[-1, 0]) if usable.numel() else None


def _across_depth(results: WatchResults, t: Thresholds, direction: str) -> Finding | None:
    paths, norms = gradient_table(results)
    ref = _reference_row(norms)
    if ref is None or ref == 0:
        return None
    base = norms[ref]
    ratios = windowed_median(norms[:ref] / torch.where(base > 0, base, float("nan")), t.window)  # (ref, S')
    hit = ratios >= t.grad_depth_ratio if direction == "exploding" else ratios <= 1 / t.grad_depth_ratio
    index = first_index(hit.any(0))
    if index is None:
        return None
    layer = int(hit[:, index].nonzero()[-1, 0])  # the crossing nearest the loss
    extreme = ratios[:, index].nan_to_num(1.0)
    worst = int(extreme.argmax() if direction == "exploding" else extreme.argmin())
    ratio = float(ratios[layer, index])
    most = "largest" if direction == "exploding" else "smallest"
    return Finding(
        f"{direction}_gradients",
        "warning",
        paths[layer],
        step_at(results, index),
        f"gradient norm here is {_times(ratio)} that of {paths[ref]!r} (nearest the loss); "
        f"{int(hit[:, index].sum())} layer(s) past {t.grad_depth_ratio:g}x, the {most} {_times(float(extreme[worst]))} "
        f"at {paths[worst]!r}",
        {
            "across": "depth",
            "ratio": ratio,
            "reference": paths[ref],
            "layers": int(hit[:, index].sum()),
            "extreme_ratio": float(extreme[worst]),
            "extreme_layer": paths[worst],
        },
        _ADVICE[direction],
    )


def _loss_stalled(results: WatchResults, t: Thresholds) -> torch.Tensor | None:
    if results.losses is None or results.losses.numel() == 0:
        return None
    losses = table([results.losses])[0]
    start = losses[: t.window].nanmedian()
    return windowed_median(losses, t.window) >= t.stalled_loss_fraction * start


def _over_steps(results: WatchResults, t: Thresholds, direction: str) -> Finding | None:
    paths, norms = gradient_table(results)
    if not paths or norms.shape[1] <= t.window:
        return None
    start = norms[:, : t.window].nanmedian(1).values
    ratios = windowed_median(norms, t.window) / torch.where(start > 0, start, float("nan"))[:, None]
    if direction == "exploding":
        hit = ratios >= t.grad_step_ratio
    else:
        stalled = _loss_stalled(results, t)
        if stalled is None:
            return None  # without the loss, shrinking gradients cannot be told from convergence
        hit = (ratios <= 1 / t.grad_step_ratio) & stalled[None, :]
    index = first_index(hit.any(0))
    if index is None:
        return None
    at = torch.where(hit[:, index], ratios[:, index], float("nan"))
    layer = int(at.nan_to_num(0.0).argmax() if direction == "exploding" else at.nan_to_num(float("inf")).argmin())
    ratio = float(ratios[layer, index])
    return Finding(
        f"{direction}_gradients",
        "warning",
        paths[layer],
        step_at(results, index),
        f"gradient norm changed {_times(ratio)} from its first {t.window} recorded steps "
        f"({float(start[layer]):.3g} -> {float(norms[layer, index : index + t.window].nanmedian()):.3g})",
        {"across": "steps", "ratio": ratio, "start_norm": float(start[layer]), "layers": int(hit[:, index].sum())},
        _ADVICE[direction],
    )


def check_exploding_gradients(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """Find gradient norms that grow by `grad_depth_ratio` toward the input or `grad_step_ratio` over steps."""
    found = [_across_depth(results, thresholds, "exploding"), _over_steps(results, thresholds, "exploding")]
    return [f for f in found if f is not None]


def check_vanishing_gradients(results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    """Find gradient norms that shrink by `grad_depth_ratio` toward the input, or over steps while the loss stalls."""
    found = [_across_depth(results, thresholds, "vanishing"), _over_steps(results, thresholds, "vanishing")]
    return [f for f in found if f is not None]
