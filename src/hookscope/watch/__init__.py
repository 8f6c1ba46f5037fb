"""watch(): one line to monitor a model while it trains; what it collects is `hookscope.results.WatchResults`.

Read in this order, a value goes from a hook to the results: `_api.py` `watch()` makes a `Watch` (`_watch.py`,
a `hookscope.callbacks.Callback`; `_options.py` holds every keyword once). `Watch` composes a `Recorder`
(`_recorder.py`: the forward and gradient hooks of the selected modules and the device rows they fill, with
`_entry.py` for what a hook stages and `_params.py` for parameter gradients and update ratios; `_buffers.py`: one
row per measured step in the engine's tables, `hookscope.stats`) and a `Stepper` (`_stepper.py`: the step rule;
the one writer of `StepState`, `_step.py`, that the hooks read; `_budget.py` chooses which steps are measured;
`_store.py` keeps the closed steps on the host). `_assemble.py` and `_extras.py` turn the kept steps into
`WatchResults`. Around them: `_scaler.py` reads a `GradScaler`, `_inspect.py` what is read from modules besides
statistics, `_sinks.py` sends flushed steps to CSV, JSON lines or TensorBoard, `_wandb.py` and `_mlflow.py` to
W&B and MLflow (`_trackers.py`: the names they share), `_state.py` is the format of a resumable state.
`_attention.py` finds the attention of a model where its logits are formed and describes it per head,
`_residual.py` the repeated blocks' outputs (the residual stream); both fill rows of `_buffers.py` beside the rest.

One activation's mean, file by file (tests/watch/test_value_path.py counts the cross-file calls): `_recorder.py`
(the forward hook stages the output) -> `hookscope.stats._tables` (`RecordTable`: copied; at the flush described
by `stats/_batched.py` and combined into its row by `stats/_record.py`) -> `_buffers.py` (`StepBuffers.take`: the
rows to the host, finalized by `stats/_record.py`) -> `_store.py` (kept) -> `_assemble.py` (`WatchResults`).
"""

# `name as name`: a name of the top level, whose one home is `hookscope` (see its `__init__`); it imports from
# here too, as it always has, and this package's `__all__` does not list it again.
from .._errors import UnobservedModuleWarning
from ._api import watch as watch
from ._mlflow import MLflowSink
from ._sinks import CSVSink, JSONLSink, TensorBoardSink
from ._wandb import WandbSink
from ._watch import Watch as Watch

__all__ = [
    "CSVSink",
    "JSONLSink",
    "MLflowSink",
    "TensorBoardSink",
    "UnobservedModuleWarning",
    "WandbSink",
]
