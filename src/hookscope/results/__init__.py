"""What `watch()` collected, and everything that reads it: the schema at the bottom of hookscope.

`_results.py` holds `WatchResults` (per-layer series over recorded steps, saved as safetensors + JSON) and its
schema; `_activity.py` what counts as a dead unit; `_nonfinite.py` where non-finite values first appeared;
`_merge.py` merging results across ranks (`merge_results`, collective) and combining parts in one process
(`combine_results`); `_display.py` shows results in notebooks. The recorder (`hookscope.watch`) writes
`WatchResults`; the doctor, the plots and the report import only this package to read them.
"""

# `name as name`: a name of the top level, whose one home is `hookscope` (see its `__init__`); it imports from
# here too, as it always has, and this package's `__all__` does not list it again.
from ._merge import combine_results as combine_results
from ._merge import merge_results as merge_results
from ._results import WatchResults as WatchResults

__all__: list[str] = []
