"""watch(): one line to monitor a model while it trains, and `WatchResults`, what it collected.

`_api.py` holds `watch()`, `_options.py` its keywords (written once, shared with `Watch`);
`_watch.py` `Watch` (a `hookscope.callbacks.Callback` that drives itself in plain
loops; `_scaler.py` its view of a `GradScaler`); `_recorder.py` the hooks, `_step.py` and `_params.py` what they
add to the steps' rows (`_buffers.py`: one row per recorded step in the engine's tables, `hookscope.stats`, moved
to the host when full or read; every statistic is the engine's); `_inspect.py` what is read from modules besides
statistics; `_store.py` the bounded host-side store; `_assemble.py` and `_extras.py` turn all of it into `WatchResults`
(`_results.py`: the schema the doctor, plots and report read, saved as safetensors + JSON); `_sinks.py` sends
flushed steps to CSV, JSON lines or TensorBoard; `_state.py` resumes a run. `_attention.py` finds the attention
of a model where its logits are formed and describes it per head, `_residual.py` the repeated blocks' outputs
(the residual stream); both fill rows of `_buffers.py` beside the rest.
"""

from .._errors import UnobservedModuleWarning
from ..results import ACTIVATION_STATS, GRAD_STATS, WatchResults, combine_results, merge_results
from ._api import watch
from ._inspect import identical_units
from ._options import GROUPS
from ._sinks import CSVSink, JSONLSink, Sink, TensorBoardSink
from ._watch import ACTIVATION_TYPES, Watch, default_selector

__all__ = [
    "ACTIVATION_STATS",
    "ACTIVATION_TYPES",
    "GRAD_STATS",
    "GROUPS",
    "CSVSink",
    "JSONLSink",
    "Sink",
    "TensorBoardSink",
    "UnobservedModuleWarning",
    "Watch",
    "WatchResults",
    "combine_results",
    "default_selector",
    "identical_units",
    "merge_results",
    "watch",
]
