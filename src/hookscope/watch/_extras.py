"""What `results()` adds to the per-step series: histogram edges, unit activity, identical units, unobserved
modules, and the run's metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from ..hooks import named_modules
from ._advice import unobserved_reason
from ._inspect import identical_units
from ._options import WatchOptions
from ._recorder import Recorder

__all__ = ["Extras", "collect_extras", "watch_meta"]


@dataclass
class Extras:
    """The non-series parts of `WatchResults` (histogram edges come with the series, from their ranges)."""

    unit_activity: dict[str, torch.Tensor] = field(default_factory=dict)
    identical_units: dict[str, int] = field(default_factory=dict)
    unobserved: dict[str, str] = field(default_factory=dict)


def collect_extras(recorder: Recorder, model: nn.Module | None = None, *, unobserved_only: bool = False) -> Extras:
    """Read the recorder's device-side extras back (one transfer each) and inspect the model's weights."""
    extras = Extras()
    extras.unobserved = _unobserved(recorder, model)
    if unobserved_only:
        return extras
    extras.unit_activity = _unit_activity(recorder)
    if "identical_units" in recorder.options.groups:
        for path, ref in zip(recorder.paths, recorder.module_refs, strict=True):
            module = ref()
            count = None if module is None else identical_units(module)
            if count is not None:
                extras.identical_units[path] = count
    return extras


def _unit_activity(recorder: Recorder) -> dict[str, torch.Tensor]:
    fractions = recorder.buffers.acts.unit_activity()
    present = [(j, t) for j, t in enumerate(fractions) if t is not None]
    if not present:
        return {}
    flat = torch.cat([t.reshape(-1) for _, t in present]).cpu()  # one transfer
    out, start = {}, 0
    for j, tensor in present:
        out[recorder.paths[j]] = flat[start : start + tensor.numel()].clone()
        start += tensor.numel()
    return out


def _unobserved(recorder: Recorder, model: nn.Module | None) -> dict[str, str]:
    modules = dict(named_modules(model)) if model is not None else {}
    out = {}
    for j, path in enumerate(recorder.paths):
        if not recorder.observed[j]:
            parent = modules.get(path.rpartition(".")[0]) if "." in path else (model if path else None)
            out[path] = unobserved_reason(path, recorder.module_refs[j](), parent)
    return out


def watch_meta(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, options: WatchOptions, select: Any
) -> dict[str, Any]:
    """JSON-able description of the run: model and optimizer classes, options, versions."""
    return {
        "model": type(model).__name__,
        "optimizer": None if optimizer is None else type(optimizer).__name__,
        "step": "optimizer step" if optimizer is not None else "training forward of the root model",
        "torch": torch.__version__,
        "select": "default" if select is None else repr(select),
        "every": options.every,
        "budget": options.budget if options.is_budgeted else None,
        "train_only": options.train_only,
        "groups": sorted(options.groups),
        "capacity": options.capacity,
        "hist_bins": options.hist_bins,
        "hist_range": None if options.hist_range is None else list(options.hist_range),
        "near_zero": options.near_zero,
        "near_zero_rule": f"|x| <= {options.near_zero:g}",
        "exact": options.exact,
        "grad_reduction": "local (before any distributed reduction)"
        if optimizer is None
        else "as seen by the optimizer (after DDP's all-reduce when wrapped)",
    }
