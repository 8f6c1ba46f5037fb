"""Exploding and vanishing gradients: per-layer gradient norms that move by orders of magnitude.

Across depth, each layer's output-gradient norm is compared with that of the layer of the same kind nearest the
loss, at the same step. A kind is a module type at one place in repeated blocks (`layer_kind`): the query of
block 0 is compared with the query of block 11, never with the classifier, because attention queries and keys
and normalization layers have naturally small output gradients, and layers just before a batch norm large ones.
Vanishing across depth is reported only where learning stalls: when update ratios were recorded, the weights
the gradient reaches first (the layer's own, else those of the nearest layer before it) must also move by at
most `lr_low_ratio` of their norm per step, or `grad_depth_ratio` times less than the model's median weight
(an optimizer such as Adam rescales small gradients, and then nothing stalls). Over steps, each layer is
compared with its own median over the first recorded steps. All are judged on medians over `window`
consecutive recorded steps. Output-gradient norms are used when `watch()` recorded them, else
parameter-gradient norms per module.
"""

from __future__ import annotations

import re

import torch

from ..results._results import WatchResults
from ..stats._norms import root_sum_squares
from ._finding import Finding
from ._series import first_index, index_of_step, layer_order, module_of, step_at, table, windowed_median
from ._thresholds import Thresholds

__all__ = ["check_exploding_gradients", "check_vanishing_gradients", "gradient_table", "layer_kind"]

_ADVICE = {
    "exploding": "Clip gradients (torch.nn.utils.clip_grad_norm_), lower the learning rate, add normalization "
    "or residual connections, or shrink the initialization.",
    "vanishing": "Use ReLU-family activations with Kaiming init, normalization layers or residual connections; "
    "avoid deep stacks of saturating tanh/sigmoid.",
}
_NUMBER = re.compile(r"\d+")


def layer_kind(results: WatchResults, path: str) -> str:
    """A layer's kind: its module type and its path with every number starred (`"Linear encoder.layer.*.query"`).

    Layers of one kind are the same layer in repeated blocks (`layer.0.query`, `layer.11.query`) or in a stack
    (`"0"`, `"2"`, `"4"` of an `nn.Sequential`; `fc1`, `fc2`).
    """
    return f"{results.layers.get(path, '?')} {_NUMBER.sub('*', path)}"


def gradient_table(results: WatchResults) -> tuple[list[str], torch.Tensor]:
    """Per-layer gradient norms in forward order: output gradients, else parameter gradients combined per module.

    Shape:
        (L, S) float64, NaN where not observed or not finite, and from the first step whose forward, backward or
        loss became non-finite on (what follows a NaN is its consequence, not a trend).
    """
    order = layer_order(results)
    if results.output_grads:
        paths = [p for p in order if "norm" in results.output_grads.get(p, {})]
        norms = table([results.output_grads[p]["norm"] for p in paths])
    else:
        parts: dict[str, list[torch.Tensor]] = {}
        for name, stats in results.param_grads.items():
            if "norm" in stats:
                parts.setdefault(module_of(name), []).append(stats["norm"])
        paths = sorted(parts, key=lambda p: order.index(p) if p in order else len(order))
        norms = table([root_sum_squares(torch.stack(parts[p]), dim=0) for p in paths])
    norms[:, _first_broken(results) :] = float("nan")  # after a NaN/Inf, gradient figures say nothing new
    return paths, norms


def _first_broken(results: WatchResults) -> int:
    """The position of the first recorded step whose forward, backward or loss became non-finite (else S)."""
    broken = [
        index_of_step(results, int(hit["step"]))
        for hit in (results.first_nonfinite or {}).values()
        if isinstance(hit, dict) and "step" in hit
    ]
    if results.losses is not None:
        broken.append(first_index(~torch.isfinite(results.losses) & results.loss_logged()))
    return min((index for index in broken if index is not None), default=results.num_steps)


def _times(ratio: float) -> str:
    return "0x (no gradient at all)" if ratio == 0 else f"{ratio:.2g}x"


def _depth_ratios(
    results: WatchResults, paths: list[str], norms: torch.Tensor, window: int
) -> tuple[torch.Tensor, list[int]]:
    """(L, S') windowed ratios of each layer's norm to that of its kind's layer nearest the loss, and that layer.

    NaN (and reference -1) for the reference layers themselves and for kinds of one layer.
    """
    ratios = torch.full_like(windowed_median(norms, window), float("nan"))
    references = [-1] * len(paths)
    groups: dict[str, list[int]] = {}
    for row, path in enumerate(paths):
        groups.setdefault(layer_kind(results, path), []).append(row)
    for rows in groups.values():
        usable = [r for r in rows if bool(((norms[r] > 0) & torch.isfinite(norms[r])).any())]
        if len(usable) < 2:
            continue
        reference, before = usable[-1], usable[:-1]
        base = norms[reference]
        ratios[before] = windowed_median(norms[before] / torch.where(base > 0, base, float("nan")), window)
        for row in before:
            references[row] = reference
    return ratios, references


def _learning(results: WatchResults, paths: list[str], t: Thresholds, width: int) -> torch.Tensor:
    """(L, S') True where the weights a layer's gradient reaches first still learn: their update ratio (windowed
    median) is above `lr_low_ratio` and at least 1/`grad_depth_ratio` of the model's median weight's; False where
    they stall or are unknown (no update ratios, or no step taken)."""
    names = [n for n in results.update_ratios if n.rpartition(".")[2] != "bias"]
    learning = torch.zeros(len(paths), width, dtype=torch.bool)
    if not names:
        return learning
    ratios = table([results.update_ratios[n] for n in names])
    ratios[ratios <= 0] = float("nan")  # a step not taken (frozen, skipped, or lost to rounding) shows no learning
    medians = windowed_median(ratios, t.window)[:, :width]
    floor = torch.maximum(medians.nanmedian(0).values / t.grad_depth_ratio, torch.tensor(t.lr_low_ratio))
    rows: dict[str, list[int]] = {}
    for row, name in enumerate(names):
        rows.setdefault(module_of(name), []).append(row)
    order = layer_order(results)
    for index, path in enumerate(paths):
        upstream = order[: order.index(path) + 1] if path in order else [path]
        source = next((p for p in reversed(upstream) if p in rows), None)
        if source is not None:
            learning[index, : medians.shape[1]] = medians[rows[source]].nanmedian(0).values > floor
    return learning


def _across_depth(results: WatchResults, t: Thresholds, direction: str) -> Finding | None:
    paths, norms = gradient_table(results)
    if not paths:
        return None
    ratios, references = _depth_ratios(results, paths, norms, t.window)
    if direction == "exploding":
        hit = ratios >= t.grad_depth_ratio
    else:
        hit = (ratios <= 1 / t.grad_depth_ratio) & ~_learning(results, paths, t, ratios.shape[1])
    index = first_index(hit.any(0))
    if index is None:
        return None
    layer = int(hit[:, index].nonzero()[-1, 0])  # the crossing nearest the loss
    extreme = ratios[:, index].nan_to_num(1.0)
    worst = int(extreme.argmax() if direction == "exploding" else extreme.argmin())
    ratio, reference = float(ratios[layer, index]), paths[references[layer]]
    most = "largest" if direction == "exploding" else "smallest"
    return Finding(
        f"{direction}_gradients",
        "warning",
        paths[layer],
        step_at(results, index),
        f"gradient norm here is {_times(ratio)} that of {reference!r}, the same kind of layer nearest the loss; "
        f"{int(hit[:, index].sum())} layer(s) past {t.grad_depth_ratio:g}x, the {most} {_times(float(extreme[worst]))} "
        f"at {paths[worst]!r}",
        {
            "across": "depth",
            "ratio": ratio,
            "reference": reference,
            "kind": layer_kind(results, paths[layer]),
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
