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

# `name as name`: a name of the top level, whose one home is `hookscope` (see its `__init__`); it imports from
# here too, as it always has, and this package's `__all__` does not list it again.
from ._average import CAReducer as CAReducer
from ._average import EMAReducer as EMAReducer
from ._base import Reducer as Reducer
from ._histogram import HistogramReducer as HistogramReducer
from ._history import HistoryReducer as HistoryReducer
from ._history import PassthroughReducer as PassthroughReducer
from ._sample import QuantileReducer as QuantileReducer
from ._sample import ReservoirReducer as ReservoirReducer
from ._stats import StatsReducer as StatsReducer

__all__: list[str] = []
