"""hookscope: see and steer what happens inside a PyTorch model while it trains.

The top level holds what a user types in the first hour: `watch`, `summary`, `diagnose`, the fastai vocabulary,
the weight tools, the monitor and reducer classes, saving and merging. Everything else lives in its subpackage
(`hookscope.hooks`, `hookscope.weights`, `hookscope.doctor`, `hookscope.summary` ...). Each public name has one
home, the one `__all__` that lists it: a name listed here is not listed again by its subpackage (it still imports
from there, as it always has), and each is imported here from the private module that defines it. The names the
first releases (the seed) had here and that live in a subpackage now still import from here, without a warning
(`ELSEWHERE`).
"""

from __future__ import annotations

import importlib
from typing import Any

from ._errors import HookscopeWarning
from ._version import __version__
from .callbacks._activation_stats import ActivationStats
from .callbacks._base import Callback
from .callbacks._hook_callback import HookCallback
from .checkpoint import load_state, save_state
from .doctor._diagnose import diagnose
from .doctor._finding import format_findings
from .hooks._fastai import Hook, Hooks, hook_output, hook_outputs
from .hooks._listing import list_hooks, remove_hooks
from .hooks._registry import scope
from .hooks._select import select_modules
from .monitors._base import Monitor
from .monitors._forward import DifferenceMonitor, InputMonitor, OutputMonitor, StateMonitor
from .monitors._grad import OutputGradMonitor, ParameterGradMonitor
from .monitors._pool import MonitorPool
from .reducers._average import CAReducer, EMAReducer
from .reducers._base import Reducer
from .reducers._histogram import HistogramReducer
from .reducers._history import HistoryReducer, PassthroughReducer
from .reducers._sample import QuantileReducer, ReservoirReducer
from .reducers._stats import StatsReducer
from .results._merge import combine_results, merge_results
from .results._results import WatchResults
from .summary._api import summary
from .summary._probes import (
    dummy_eval,
    has_params,
    layer_info,
    model_sizes,
    module_summary,
    num_features_model,
    total_params,
)
from .watch._api import watch
from .watch._watch import Watch
from .weights._change import add_weight_change_monitor_hook, add_weight_distribution_monitor, compute_weight_changes
from .weights._constrain import add_weight_norm_constraint_hook
from .weights._detect import detect_weight_symmetry_breaking
from .weights._summary import print_weight_summary
from .weights._updates import add_weight_update_monitor_hook, analyze_weight_updates, restore_optimizer_step

__all__ = [
    "ActivationStats",
    "CAReducer",
    "Callback",
    "DifferenceMonitor",
    "EMAReducer",
    "HistogramReducer",
    "HistoryReducer",
    "Hook",
    "HookCallback",
    "Hooks",
    "HookscopeWarning",
    "InputMonitor",
    "Monitor",
    "MonitorPool",
    "OutputGradMonitor",
    "OutputMonitor",
    "ParameterGradMonitor",
    "PassthroughReducer",
    "QuantileReducer",
    "Reducer",
    "ReservoirReducer",
    "StateMonitor",
    "StatsReducer",
    "Watch",
    "WatchResults",
    "__version__",
    "add_weight_change_monitor_hook",
    "add_weight_distribution_monitor",
    "add_weight_norm_constraint_hook",
    "add_weight_update_monitor_hook",
    "analyze_weight_updates",
    "combine_results",
    "compute_weight_changes",
    "detect_weight_symmetry_breaking",
    "diagnose",
    "dummy_eval",
    "format_findings",
    "has_params",
    "hook_output",
    "hook_outputs",
    "layer_info",
    "list_hooks",
    "load_state",
    "merge_results",
    "model_sizes",
    "module_summary",
    "num_features_model",
    "print_weight_summary",
    "remove_hooks",
    "restore_optimizer_step",
    "save_state",
    "scope",
    "select_modules",
    "summary",
    "total_params",
    "watch",
]

ELSEWHERE = {
    **dict.fromkeys(
        (
            "CompiledModelWarning",
            "HookHandle",
            "HookInfo",
            "named_modules",
            "normalize_path",
            "register_global_module_hook",
            "register_global_optimizer_hook",
            "register_module_hook",
            "register_optimizer_hook",
            "register_output_grad_hook",
            "register_post_accumulate_grad_hook",
            "register_tensor_hook",
        ),
        "hookscope.hooks",
    ),
    **dict.fromkeys(("Clamp", "MaxNorm", "NonNeg", "UnitNorm", "register_constraint"), "hookscope.weights"),
    "Finding": "hookscope.doctor",
    "LoopDriver": "hookscope.callbacks",
    "MergeWarning": "hookscope.distributed",
    "ModelSummary": "hookscope.summary",
    "UnobservedModuleWarning": "hookscope.watch",
}
"""Names the seed had at the top level that live in a subpackage now (name -> that subpackage); they import from
`hookscope` too, without a warning, but are not listed in `__all__`."""

SUBPACKAGES = (
    "callbacks",
    "checkpoint",
    "cli",
    "distributed",
    "doctor",
    "hooks",
    "integrations",
    "monitors",
    "plot",
    "reducers",
    "report",
    "stats",
    "steer",
    "summary",
    "watch",
    "weights",
)
"""The public subpackages, listed by `dir(hookscope)` beside `__all__`."""


def __getattr__(name: str) -> Any:
    """Resolve a name of the seed's top level that lives in a subpackage (`ELSEWHERE`)."""
    home = ELSEWHERE.get(name)
    if home is None:
        raise AttributeError(f"module 'hookscope' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted({*__all__, *SUBPACKAGES})
