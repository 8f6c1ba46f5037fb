"""How transformers fail: attention-logit growth, entropy collapse, Adam's epsilon, loss spikes, massive
activations and attention sinks.

Each check reads `WatchResults.attention` (per head: max logit, entropy, sink), `residual` (the repeated blocks'
largest magnitude and median), `optimizer` (gradient RMS against epsilon) or `losses`; the numbers they compare
against are `Thresholds` fields. Low entropy alone is never a fault (induction heads attend to one key by
design): entropy collapse is reported only where the same layer's max logit is out of bounds too, or where every
head of the layer collapsed during the learning-rate warmup (read from the optimizer's learning-rate series).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..results._results import WatchResults
from ._finding import Finding
from ._series import first_index, layer_order, module_of, step_at, warmup_length, windowed_median
from ._thresholds import Thresholds

__all__ = [
    "check_adam_epsilon",
    "check_attention_entropy_collapse",
    "check_attention_logit_growth",
    "check_attention_sink",
    "check_loss_spike",
    "check_massive_activation",
]


def _heads(series: torch.Tensor) -> torch.Tensor:
    """(S, heads) -> (heads, S) float64 with non-finite values as NaN."""
    values = series.detach().double().T.clone()
    values[~torch.isfinite(values)] = float("nan")
    return values


def _largest_head(results: WatchResults, path: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The largest max logit over heads per step (S,) and the head it came from, or `None` without a series."""
    series = results.attention.get(path, {}).get("max_logit")
    if series is None or series.numel() == 0:
        return None
    values = _heads(series).nan_to_num(float("-inf"))
    largest, head = values.max(dim=0)
    largest[torch.isinf(largest)] = float("nan")
    return largest, head


def _out_of_bounds(results: WatchResults, path: str, thresholds: Thresholds) -> tuple[int, int, int] | None:
    """`(onset index, crossing index, head)` when `path`'s max logit grew `attention_logit_growth` times above
    its first steps and its windowed median went past `attention_logit_limit`; else `None`."""
    found = _largest_head(results, path)
    if found is None:
        return None
    largest, head = found
    smooth = windowed_median(largest, thresholds.window)
    crossing = first_index(smooth > thresholds.attention_logit_limit)
    if crossing is None:
        return None
    baseline = float(largest[: thresholds.window].nanmedian())
    if not baseline > 0 or float(smooth[crossing]) < baseline * thresholds.attention_logit_growth:
        return None  # large from the start: not a growth
    last = largest.numel() - 1
    at = min(crossing + thresholds.window - 1 if largest.numel() >= thresholds.window else crossing, last)
    # where the growth began: after the last step whose logit was `attention_logit_growth` times below the crossing
    smaller = (largest[:at] <= float(largest[at]) / thresholds.attention_logit_growth).nonzero()
    onset = int(smaller[-1, 0]) + 1 if smaller.numel() else 0
    return onset, at, int(head[at])


def check_attention_logit_growth(results: WatchResults, thresholds: Thresholds) -> Iterator[Finding]:
    """Warn where a layer's largest pre-softmax logit grew out of bounds (Dehghani et al. 2023; Wortsman et al.
    2023: runs with logits above 1e4 diverged): the step is where the growth began, the evidence names the head."""
    for path in results.attention:
        found = _out_of_bounds(results, path, thresholds)
        if found is None:
            continue
        onset, crossing, head = found
        largest = _heads(results.attention[path]["max_logit"])
        last = float(largest[:, -1].nan_to_num(float("-inf")).max())
        baseline = float(largest[:, : thresholds.window].nanmedian())
        yield Finding(
            "attention_logit_growth",
            "warning",
            path,
            step_at(results, onset),
            f"the largest attention logit grew from {baseline:.3g} to {float(largest[head, crossing]):.4g} (head "
            f"{head}) by step {step_at(results, crossing)}, past {thresholds.attention_logit_limit:.3g}; attention "
            "becomes one-hot and training stalls or diverges",
            evidence={
                "head": head,
                "max_logit": float(largest[head, crossing]),
                "max_logit_last": last,
                "baseline": baseline,
                "crossed_at": step_at(results, crossing),
                "limit": thresholds.attention_logit_limit,
            },
            advice="normalize queries and keys (qk-layernorm), lower the learning rate, or add z-loss",
        )


def check_attention_entropy_collapse(results: WatchResults, thresholds: Thresholds) -> Iterator[Finding]:
    """Warn where a layer's attention entropy collapsed to near one-hot (Zhai et al. 2023), but only where
    something corroborates it, as low entropy alone is no fault (induction heads are sharp by design): the same
    layer's max logit out of bounds (`attention_logit_growth`'s rule), or else every head of the layer collapsed
    during the learning-rate warmup (`warmup_length`; never when the learning rate is unknown)."""
    warmup = warmup_length(results)
    for path, stats in results.attention.items():
        entropy = stats.get("entropy")
        if entropy is None or entropy.numel() == 0:
            continue
        smooth = windowed_median(_heads(entropy), thresholds.window)  # (heads, S')
        low = smooth < thresholds.attention_entropy_floor
        bounds = _out_of_bounds(results, path, thresholds)
        if bounds is not None:
            yield from _collapse_with_growth(results, path, smooth, low, bounds, thresholds)
        elif warmup is not None:
            yield from _collapse_in_warmup(results, path, _heads(entropy), smooth, warmup, thresholds)


def _collapse_with_growth(
    results: WatchResults,
    path: str,
    smooth: torch.Tensor,
    low: torch.Tensor,
    bounds: tuple[int, int, int],
    thresholds: Thresholds,
) -> Iterator[Finding]:
    """The collapse of any head from where `path`'s max logit began to grow out of bounds (`bounds`)."""
    since = low[:, bounds[0] :]
    collapsed = [h for h in range(low.shape[0]) if bool(since[h].any())]
    if not collapsed:
        return
    head = min(collapsed, key=lambda h: first_index(since[h]) or 0)
    onset = bounds[0] + (first_index(since[head]) or 0)
    yield Finding(
        "attention_entropy_collapse",
        "warning",
        path,
        step_at(results, onset),
        f"the attention entropy of {len(collapsed)} of {low.shape[0]} head(s) fell below "
        f"{thresholds.attention_entropy_floor:g} (of its maximum) while the layer's max logit grew past "
        f"{thresholds.attention_logit_limit:.3g}: attention collapsed to one key",
        evidence={
            "head": head,
            "heads_collapsed": len(collapsed),
            "heads": int(low.shape[0]),
            "entropy": float(smooth[head, onset]),
            "corroboration": "max_logit",
            "max_logit_crossed_at": step_at(results, bounds[1]),
        },
        advice="normalize queries and keys (qk-layernorm), lower the learning rate or lengthen the warmup",
    )


def _collapse_in_warmup(
    results: WatchResults,
    path: str,
    entropy: torch.Tensor,
    smooth: torch.Tensor,
    warmup: int,
    thresholds: Thresholds,
) -> Iterator[Finding]:
    """The first window of `window` recorded steps, all in the warmup's first `warmup`, over which every head of
    `path` had its median entropy (`smooth`, of `entropy` (heads, S)) below the floor; the finding's step is the
    window's first step where every head was below it (the window's first step if none was)."""
    floor = thresholds.attention_entropy_floor
    width = max(min(thresholds.window, results.num_steps), 1)  # the steps one position covers (`windowed_median`)
    inside = max(warmup - width + 1, 0)  # the positions whose steps all lie in the warmup
    start = first_index((smooth < floor).all(0)[:inside])
    if start is None:
        return
    onset = start + (first_index((entropy[:, start : start + width] < floor).all(0)) or 0)
    head = int(smooth[:, start].argmax())  # the least collapsed head: every other is further below the floor
    largest = _largest_head(results, path)
    max_logit = float(largest[0][onset]) if largest is not None else float("nan")
    heads = int(smooth.shape[0])
    yield Finding(
        "attention_entropy_collapse",
        "warning",
        path,
        step_at(results, onset),
        f"the attention entropy of every head ({heads}) of the layer fell below {floor:g} "
        f"(of its maximum) during the learning-rate warmup (rising through step {step_at(results, warmup - 1)}), its "
        f"max logit at {max_logit:.3g}: attention collapsed to one key before training settled",
        evidence={
            "head": head,
            "heads_collapsed": heads,
            "heads": heads,
            "entropy": float(smooth[head, start]),
            "corroboration": "warmup",
            "max_logit": max_logit,
            "warmup_end": step_at(results, warmup - 1),
        },
        advice="lengthen the warmup or lower the peak learning rate; with qk-layernorm, keep its gains from "
        "growing (weight decay on them, or a smaller learning rate for them)",
    )


def check_attention_sink(results: WatchResults, thresholds: Thresholds) -> Iterator[Finding]:
    """Note heads that park most of their attention on the first key (an attention sink: informational)."""
    for path, stats in results.attention.items():
        sink = stats.get("sink")
        if sink is None or sink.numel() == 0:
            continue
        smooth = windowed_median(_heads(sink), thresholds.window)
        high = smooth > thresholds.attention_sink_share
        heads = [h for h in range(high.shape[0]) if bool(high[h].any())]
        if not heads:
            continue
        head = min(heads, key=lambda h: first_index(high[h]) or 0)
        onset = first_index(high[head]) or 0
        yield Finding(
            "attention_sink",
            "info",
            path,
            step_at(results, onset),
            f"{len(heads)} head(s) put over {thresholds.attention_sink_share:.0%} of their attention on the first "
            "key (an attention sink; common and usually harmless)",
            evidence={"head": head, "sink": float(smooth[head, onset]), "heads_sinking": len(heads)},
            advice="nothing to fix by itself; it explains massive activations at the first token",
        )


def check_massive_activation(results: WatchResults, thresholds: Thresholds) -> Iterator[Finding]:
    """Note the first repeated block whose output holds a value over `massive_magnitude` and `massive_ratio`
    times its hidden state's median magnitude (Sun et al. 2024), with its channel and token."""
    order = {path: i for i, path in enumerate(layer_order(results))}
    for path in sorted(results.residual, key=lambda p: order.get(p, len(order))):
        stats = results.residual[path]
        largest, median = stats["max"].double(), stats["median"].double()
        massive = (largest > thresholds.massive_magnitude) & (largest >= thresholds.massive_ratio * median)
        index = first_index(massive)
        if index is None:
            continue
        yield Finding(
            "massive_activation",
            "info",
            path,
            step_at(results, index),
            f"a residual-stream value of {float(largest[index]):.4g}, {float(largest[index] / median[index]):.3g} "
            f"times the median magnitude {float(median[index]):.3g}, at channel {int(stats['channel'][index])} of "
            f"token {int(stats['token'][index])}",
            evidence={
                "channel": int(stats["channel"][index]),
                "token": int(stats["token"][index]),
                "magnitude": float(largest[index]),
                "median": float(median[index]),
            },
            advice="usually paired with an attention sink; a problem only for quantization or when it keeps growing",
        )
        return  # the first block where it appears: later blocks carry it along the residual stream


def check_adam_epsilon(results: WatchResults, thresholds: Thresholds) -> Iterator[Finding]:
    """Warn when most weight tensors' gradient RMS is below the optimizer's epsilon (Wortsman et al. 2023,
    section 3.4): their updates shrink towards zero and they stop learning."""
    names = [n for n, s in results.optimizer.items() if not n.endswith(".bias") and bool(s["eps"].isfinite().any())]
    if not names:
        return
    rms = torch.stack([results.optimizer[n]["grad_rms"].double() for n in names])
    eps = torch.stack([results.optimizer[n]["eps"].double() for n in names])
    seen = rms.isfinite() & eps.isfinite()
    below = ((rms < eps) & seen).sum(0).double() / seen.sum(0).clamp(min=1)
    smooth = windowed_median(torch.where(seen.any(0), below, float("nan")), thresholds.window)
    index = first_index(smooth >= thresholds.epsilon_layer_fraction)
    if index is None:
        return
    ratio = (rms[:, index] / eps[:, index]).nanmedian()
    yield Finding(
        "adam_epsilon_too_large",
        "warning",
        None,
        step_at(results, index),
        f"{float(below[index]):.0%} of the weight tensors have a gradient RMS below the optimizer's epsilon "
        f"({float(eps[:, index].nanmedian()):.3g}; median ratio {float(ratio):.3g}): their updates shrink towards "
        "zero and they stop learning",
        evidence={
            "fraction": float(below[index]),
            "eps": float(eps[:, index].nanmedian()),
            "rms_over_eps": float(ratio),
        },
        advice="lower the optimizer's eps (1e-15 or below) or scale the loss up",
    )


def check_loss_spike(results: WatchResults, thresholds: Thresholds) -> Iterator[Finding]:
    """Warn at a sudden loss jump that lasts: the `loss_spike_window` losses from a step on are all above every
    one of the `2 * loss_spike_window` before it, and their median is `loss_spike_ratio` times theirs. The loss
    of every logged step is read (`logged_losses`) when it holds more steps than the measured ones. The evidence
    names the layer whose max logit or gradient norm jumped first (on the measured steps)."""
    found = results.loss_series()
    if found is None:
        return
    steps, losses = found
    after, before = thresholds.loss_spike_window, 2 * thresholds.loss_spike_window
    finite = torch.isfinite(losses)
    for index in range(before, losses.numel() - after + 1):
        previous, following = losses[index - before : index], losses[index : index + after]
        if not bool(finite[index - before : index + after].all()):
            continue
        if float(following.min()) > float(previous.max()) and float(following.median()) >= (
            thresholds.loss_spike_ratio * float(previous.median())
        ):
            step = int(steps[index])
            measured = min(int(torch.searchsorted(results.steps.contiguous(), step)), max(results.num_steps - 1, 0))
            yield _spike(results, step, measured, float(previous.median()), float(following.median()), thresholds)
            return


def _spike(
    results: WatchResults, step: int, index: int, before: float, after: float, thresholds: Thresholds
) -> Finding:
    evidence: dict[str, float | int | str | None] = {"loss_before": before, "loss_after": after}
    first = _first_jump(results, index, thresholds) if results.num_steps else None
    if first is not None:
        evidence.update(layer=first[0], signal=first[1], signal_step=step_at(results, first[2]))
    where = "" if first is None else f"; {first[1]} of {first[0]!r} jumped first, at step {step_at(results, first[2])}"
    return Finding(
        "loss_spike",
        "warning",
        None,
        step,
        f"the loss jumped from {before:.4g} to {after:.4g} and stayed there{where}",
        evidence=evidence,
        advice="lower the learning rate or its peak, clip gradients harder, or restart from a checkpoint before it "
        "and skip the batches that triggered it",
    )


def _first_jump(results: WatchResults, index: int, thresholds: Thresholds) -> tuple[str, str, int] | None:
    """The layer whose max logit or gradient norm rose `2 * loss_spike_ratio` times over its median of the
    `2 * loss_spike_window` steps before the jump first (from the step before the loss jumped: the optimizer step
    that caused it), the largest rise first among those of one step, as `(path, signal, index)`."""
    start = max(index - 1, 0)
    base = slice(max(start - 2 * thresholds.loss_spike_window, 0), start)
    candidates: list[tuple[int, float, str, str]] = []
    signals = [(p, "max_logit", _largest_head(results, p)) for p in results.attention]
    grads = [(module_of(n), "grad_norm", s.get("norm")) for n, s in results.param_grads.items()]
    for path, signal, found in [*((p, s, f[0] if f else None) for p, s, f in signals), *grads]:
        if found is None or found.numel() <= index or base.stop <= base.start:
            continue
        values = found.double()
        reference = float(values[base].nanmedian())
        if not reference > 0:
            continue
        window = values[start : index + thresholds.loss_spike_window] / reference
        jumped = first_index(window >= thresholds.loss_spike_ratio * 2)
        if jumped is not None:
            candidates.append((start + jumped, -float(window[jumped]), path, signal))
    if not candidates:
        return None
    step, _, path, signal = min(candidates)
    return path, signal, step
