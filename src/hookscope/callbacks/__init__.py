"""Training-loop callbacks: the event protocol, a driver for plain loops, HookCallback and ActivationStats.

`_steps.py` is the one rule of what a training step is and which forwards belong to it (every recorder follows
it). `Callback` (`_base.py`) names the events of a training run (fit start/end, batch start/end, after backward,
before/after the optimizer step) with a `state_dict`; `LoopDriver` emits them from a plain PyTorch loop through
hooks on the root model and the optimizer (`callback.attach(model)`), and `hookscope.integrations` emits them
from Lightning and Hugging Face trainers; both number the batches by the run's one count (`BatchNumbers`: the
step state of a watch among their callbacks, else their own). `HookCallback` (fastai's) places hooks on modules
for a fit or for some batches; `ActivationStats` builds on it to record per-batch activation statistics on the
device. `hookscope.watch` is a callback too. Nothing here imports the trainers.
"""

# `name as name`: a name of the top level, whose one home is `hookscope` (see its `__init__`); it imports from
# here too, as it always has, and this package's `__all__` does not list it again.
from ._activation_stats import ActivationStats as ActivationStats
from ._activation_stats import RecordsDroppedWarning
from ._base import Callback as Callback
from ._base import LoopDriver
from ._hook_callback import HookCallback as HookCallback
from ._merge import combine_activation_stats, merge_activation_stats

__all__ = [
    "LoopDriver",
    "RecordsDroppedWarning",
    "combine_activation_stats",
    "merge_activation_stats",
]
