"""What `watch()` collected, and everything that reads it: the schema at the bottom of hookscope.

`_results.py` holds `WatchResults` (per-layer series over recorded steps, saved as safetensors + JSON) and its
schema; `_activity.py` what counts as a dead unit; `_nonfinite.py` where non-finite values first appeared;
`_merge.py` merging results across ranks (`merge_results`, collective) and combining parts in one process
(`combine_results`); `_display.py` shows results in notebooks. The recorder (`hookscope.watch`) writes
`WatchResults`; the doctor, the plots and the report import only this package to read them.
"""

from ._activity import DEAD_UNIT_ACTIVITY, UnitCounts, count_inactive_units
from ._merge import combine_results, merge_results
from ._nonfinite import first_from_flags, first_nonfinite, merge_first
from ._results import (
    ACTIVATION_STATS,
    ATTENTION_STATS,
    FIRST_NONFINITE,
    GRAD_STATS,
    OPTIMIZER_STATS,
    RESIDUAL_STATS,
    RESULTS_FILE,
    SCHEMA,
    WatchResults,
    results_file,
)

__all__ = [
    "ACTIVATION_STATS",
    "ATTENTION_STATS",
    "DEAD_UNIT_ACTIVITY",
    "FIRST_NONFINITE",
    "GRAD_STATS",
    "OPTIMIZER_STATS",
    "RESIDUAL_STATS",
    "RESULTS_FILE",
    "SCHEMA",
    "UnitCounts",
    "WatchResults",
    "combine_results",
    "count_inactive_units",
    "first_from_flags",
    "first_nonfinite",
    "merge_first",
    "merge_results",
    "results_file",
]
