"""`watch()`: one line that monitors a model while it trains (it makes a `Watch`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .._check import checked
from ._options import WatchCall, options_signature
from ._watch import Watch

__all__ = ["watch"]


@checked()
@options_signature(WatchCall)
def watch(model: nn.Module, optimizer: torch.optim.Optimizer | None = None, **options: Any) -> Watch:
    """Monitor `model` while it trains: use as `with watch(model, opt) as w: <train>`, then `w.results()`.

    For the modules `select` picks, records per step: activation statistics of each output (`ACTIVATION_STATS`:
    mean, std, RMS, min/max, near-zero fraction, non-finite count, saturation) and a histogram; the gradient
    norm and non-finite count of each output and of each parameter (`GRAD_STATS`); given the optimizer, the
    update-to-weight ratio of each parameter; the loss when `log_loss` is called. Also the activity of each unit
    (fraction > 0), units with identical weights, and where values first became non-finite (forward and
    backward, with the step). Wherever the model computes attention (`F.scaled_dot_product_attention`, an explicit
    softmax over (batch, heads, queries, keys) scores, `nn.MultiheadAttention`), per head: the max pre-softmax
    logit, the normalised entropy and the first key's share (`results().attention`, see `hookscope.watch._attention`
    for how it is found); for repeated blocks, the residual stream's largest value, its channel and token, and the
    median magnitude; given the optimizer, each parameter's gradient RMS beside its epsilon and its update RMS
    divided by the learning rate. All kept on the device, so no host sync per step. Statistics stay in device buffers
    and move to the host every `buffer_steps` recorded steps, when read, and at the end.

    Cost: an output or gradient of 16384 values or more is described as soon as its hook sees it, in a few
    passes. A gradient's (of an output or a parameter) norm is exact while its float32 sum of squares is finite;
    when it is not, its min/max say exactly whether a value is non-finite (an exploding gradient of finite
    values beyond float32's range is not called non-finite), and the count (at least 1 if any) and the norm are
    estimated from a sample: on the CPU the min/max and the sample are read only then, on other devices always
    (no sync). Smaller tensors are kept, and those of up to 32 steps are described together with a fixed number
    of torch calls. Steps not measured cost nothing under the budget
    (the default); with `every`, one min/max per output, or nothing with `check_nonfinite=False`. Attached before
    `torch.compile`, the hooks compile into the graph without graph breaks, and the statistics are the same as in
    eager mode (compiled backwards cannot report the order they ran in: `first_nonfinite` assumes the reverse of
    the forward order).

    A step is one optimizer step when `optimizer` is given (the forwards of gradient accumulation, and those of a
    closure such as LBFGS's, merge into it), else one training forward of `model` (the root) with its backward.
    Forwards under `no_grad`/`inference_mode`, in eval mode, that raised, or recomputed by checkpointing are not
    merged into a step (they are counted in `dropped`); see "What a step is" in the README. Modules selected but
    never run in a step are listed in `results().unobserved` with advice, and warned about once. A failure inside
    the watch's own hooks never reaches the training: it is counted in `dropped["error"]` and warned about once
    (`HookFailureWarning`), or raised with `strict=True`. A model holding the watch can be pickled, saved with
    `torch.save` and deep-copied: the copy carries no hook of the watch (it loads without hookscope).

    The keywords after `optimizer` are written once, in `hookscope.watch._options.WatchOptions` (shared with `Watch`).

    Args:
        model: The model to watch.
        optimizer: Its optimizer: steps count its steps, update ratios are recorded.
        select: Which modules (a `hookscope.hooks` selector); default: modules with parameters of their own and
            activation modules (`ACTIVATION_TYPES`).
        budget: The largest share of the run's time hookscope's statistics may take (default 0.03: 3 %).
            hookscope times its own work on the host (its hooks, the end of measured steps, flushes, the live
            doctor, and what a measured step takes beyond a step left alone) against the steps' time and measures a
            step whenever the run has time to spare, so that cost stays within the budget on any model; the first
            16 steps are measured whatever they cost. On the steps it does not measure, its hooks are off the model
            (paused, still registered; with an optimizer, from the end of the step before, all but one forward
            pre-hook on the model that numbers the steps; a model traced by `torch.compile` keeps them): what
            remains is the cost of following the steps (`make bench`). `results().meta["measured"]` says how many
            steps were measured and what they cost. `None`: measure every `every`-th step (`every=1`: every step).
        every: Measure exactly one step in `every` instead of following the budget (`every=1`: every step).
        max_steps: The number of steps the run is planned for, when known: its last step is measured too.
        train_only: Record training-mode forwards only (`False`: eval-mode forwards are steps too).
        groups: What to collect, from `GROUPS` (default: all).
        capacity: The most recorded steps kept on the host (`None`: all). When full, every other step is dropped
            (`dropped["capacity"]`) and the recording rate halves, so the series span the whole run.
        buffer_steps: Recorded steps held on the device between two transfers.
        hist_bins: Histogram bins.
        hist_range: `(low, high)` of the histograms; `None`: symmetric, from each module's first record.
        near_zero: The `near_zero` statistic counts values with `|x| <= near_zero`.
        check_nonfinite: Also check the steps not measured for non-finite outputs and gradients (one pass per
            output; the measured steps are always checked). Default: with `every`, yes; under a budget, no (a step
            not measured then costs nothing).
        sinks: Where to send each flushed block of steps (`CSVSink`, `JSONLSink`, `TensorBoardSink`).
        doctor: Run `hookscope.doctor` every `doctor_every` recorded steps and warn once per finding.
        doctor_every: See `doctor`.
        scaler: The `torch.amp.GradScaler` of a mixed-precision loop (needs `optimizer`): output-gradient norms
            are divided by the loss scale of their backward (read on the device, no sync), and a step the scaler
            skips (non-finite gradients) is a step of its own, listed in `results().skipped_steps`, with no
            parameter gradients or update ratios. Without it, such a step's forward merges into the next step.
            Parameter-gradient norms are unscaled either way (`scaler.step` unscales before the optimizer).
        exact: Describe every value of outputs of 16384 values or more. By default they are described from their
            exact sums and min/max and a sample of 7700 to 8192 values (their count, mean, min and max stay exact,
            std too while |mean| <= 4 std; the near-zero and saturated fractions, histograms and unit activity
            are estimates, and `activations[path]["sampled"]` says which steps were sampled), and a weight of
            16384 values or more and its change in an optimizer step from the same sample of its positions read
            before and after the step (its update ratio is an estimate, about 1 % for a dense change), which keeps
            monitoring cheap on large models.
        strict: Raise failures of the watch's own hooks instead of counting them; `None` reads the
            `HOOKSCOPE_STRICT` environment variable (off unless set to 1).

    Returns:
        The `Watch` (not attached yet: `with` or `attach()` attaches it).

    Raises:
        ValueError: an option is out of range, or the model is on the meta device (at attach).
        TypeError: `model` is not an `nn.Module` (or is a TorchScript module), a sink lacks `write`/`close`.

    Example:
        >>> import torch, torch.nn as nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> with watch(model, opt) as w:
        ...     for _ in range(3):
        ...         loss = model(torch.randn(16, 4)).pow(2).mean()
        ...         w.log_loss(loss)
        ...         loss.backward(); opt.step(); opt.zero_grad()
        >>> r = w.results()
        >>> r.steps.tolist(), list(r.layers), sorted(r.activations["0"])[:3]
        ([0, 1, 2], ['0', '1', '2'], ['count', 'max', 'mean'])
    """
    return Watch(model, optimizer, **options)
