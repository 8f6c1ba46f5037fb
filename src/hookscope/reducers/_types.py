"""The fixed table of hookscope's reducer types by name: what `Reducer.load(path)` may build from a file."""

from __future__ import annotations

from ._average import CAReducer, EMAReducer
from ._base import Reducer
from ._histogram import HistogramReducer
from ._history import HistoryReducer, PassthroughReducer
from ._sample import QuantileReducer, ReservoirReducer
from ._stats import StatsReducer

__all__ = ["REDUCER_TYPES"]

REDUCER_TYPES: dict[str, type[Reducer]] = {
    kind.__name__: kind
    for kind in (
        CAReducer,
        EMAReducer,
        HistogramReducer,
        HistoryReducer,
        PassthroughReducer,
        QuantileReducer,
        ReservoirReducer,
        StatsReducer,
    )
}
