"""What `results()` adds to the per-step series: histogram edges, unit activity, identical units, unobserved
modules, and the run's metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from ..hooks import named_modules
from ._advice import unobserved_reason
from ._kernels import hist_edges, identical_units
from ._options import WatchOptions
from ._recorder import Recorder

__all__ = ["Extras", "collect_extras", "watch_meta"]


@dataclass
class Extras:
    """The non-series parts of `WatchResults`."""

    hist_edges: dict[str, torch.Tensor] = field(default_factory=dict)
    unit_activity: dict[str, torch.Tensor] = field(default_factory=dict)
    identical_units: dict[str, int] = field(default_factory=dict)
    unobserved: dict[str, str] = field(default_factory=dict)


def collect_extras(
    recorder: Recorder, model: nn.Module | None = None, *, hist_only: bool = False, unobserved_only: bool = False
) -> Extras:
    """Read the recorder's device-side extras back (one transfer each) and inspect the model's weights."""
    extras = Extras()
    if not unobserved_only:
        extras.hist_edges = _edges(recorder)
    if hist_only:
        return extras
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


def _edges(recorder: Recorder) -> dict[str, torch.Tensor]:
    present = [(j, s) for j, s in enumerate(recorder.scales) if s is not None]
    if not present:
        return {}
    values = torch.stack([torch.stack((scale.float(), shift.float())) for _, (scale, shift) in present]).cpu()
    bins = recorder.options.hist_bins
    return {
        recorder.paths[j]: hist_edges(float(v[0]), float(v[1]), bins) for (j, _), v in zip(present, values, strict=True)
    }


def _unit_activity(recorder: Recorder) -> dict[str, torch.Tensor]:
    present = [(j, t) for j, t in enumerate(recorder.units) if t is not None and recorder.unit_values[j] > 0]
    if not present:
        return {}
    flat = torch.cat([t.reshape(-1) for _, t in present]).cpu().double()
    out, start = {}, 0
    for j, tensor in present:
        size = tensor.numel()
        out[recorder.paths[j]] = (flat[start : start + size] / recorder.unit_values[j]).float()
        start += size
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
        "train_only": options.train_only,
        "groups": sorted(options.groups),
        "capacity": options.capacity,
        "hist_bins": options.hist_bins,
        "hist_range": None if options.hist_range is None else list(options.hist_range),
        "near_zero": options.near_zero,
        "grad_reduction": "local (before any distributed reduction)"
        if optimizer is None
        else "as seen by the optimizer (after DDP's all-reduce when wrapped)",
    }
