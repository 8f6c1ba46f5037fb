"""Monitors: where (a module) + what (input, output, attribute, change, gradient) + a reducer.

A monitor records into a reducer (`hookscope.reducers`) that keeps bounded state over time; `MonitorPool`
places one on each module a selector picks.

`Monitor` (in `_base.py`) holds the common arguments, as inferno's: `reducer`, `module`, `train_update`,
`eval_update`, `prepend`, `filter_`, `map_`; it registers its hooks through `hookscope.hooks`, so the registry
lists them and `deregister()` or leaving a `with` block removes exactly those. `_forward.py` holds
`InputMonitor`, `OutputMonitor`, `StateMonitor` and `DifferenceMonitor`; `_grad.py` the gradient monitors
(`OutputGradMonitor` on tensor hooks of the outputs, `ParameterGradMonitor` on post-accumulate-grad hooks).
Every class has `partialconstructor(...)` returning `(attr, module) -> Monitor`, which `MonitorPool` (`_pool.py`)
calls for each module a selector picks, keyed by normalized path. Monitors and pools persist through
`state_dict()` and `save(path)` (safetensors + JSON, atomic), and resume exactly.
"""

# `name as name`: a name of the top level, whose one home is `hookscope` (see its `__init__`); it imports from
# here too, as it always has, and this package's `__all__` does not list it again.
from ._base import Monitor as Monitor
from ._forward import DifferenceMonitor as DifferenceMonitor
from ._forward import InputMonitor as InputMonitor
from ._forward import OutputMonitor as OutputMonitor
from ._forward import StateMonitor as StateMonitor
from ._grad import OutputGradMonitor as OutputGradMonitor
from ._grad import ParameterGradMonitor as ParameterGradMonitor
from ._pool import MonitorPool as MonitorPool

__all__: list[str] = []
