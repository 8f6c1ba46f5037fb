"""Reducers: bounded state over a stream of tensors, pure tensor code with no hooks inside.

A reducer takes observations with `push(*tensors)` and gives them back on demand: `peek()` (the current
value), `dump()` (everything kept, oldest first), `view(step)` (where history is kept), `dropped` (what was not
kept). State stays on the device of the pushed tensors and is updated without host-device syncs, so a
reducer can sit in a hook on the hot path; it is read only when asked. `state_dict()` / `save(path)` persist
it (safetensors + JSON, atomic). Trajectory reducers follow one tensor over time (`HistoryReducer`,
`PassthroughReducer`, `EMAReducer`, `CAReducer`); pooling reducers treat every element pushed as one value
(`StatsReducer`, `HistogramReducer`, `ReservoirReducer`, `QuantileReducer`). Monitors
(`hookscope.monitors`) feed reducers from hooks; the distributed layer combines their raw `state_dict()`s.
"""

from ._average import CAReducer, EMAReducer
from ._base import Reducer
from ._histogram import HistogramReducer
from ._history import HistoryReducer, PassthroughReducer
from ._sample import QuantileReducer, ReservoirReducer
from ._stats import StatsReducer

__all__ = [
    "CAReducer",
    "EMAReducer",
    "HistogramReducer",
    "HistoryReducer",
    "PassthroughReducer",
    "QuantileReducer",
    "Reducer",
    "ReservoirReducer",
    "StatsReducer",
]
