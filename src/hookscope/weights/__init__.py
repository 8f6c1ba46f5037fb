"""Weights: watch, analyse, constrain and undo.

The fixed `weight_hooks` API: `add_weight_change_monitor_hook` + `compute_weight_changes` (distance from a
snapshot), `add_weight_distribution_monitor` (statistics after each forward), `add_weight_update_monitor_hook` +
`restore_optimizer_step` + `analyze_weight_updates` (optimizer updates, bit-exact undo of a step),
`add_weight_norm_constraint_hook`, `detect_weight_symmetry_breaking` and `print_weight_summary`.

Beyond it: constraints (`MaxNorm`, `Clamp`, `UnitNorm`, `NonNeg`) placed by `register_constraint` as a
parametrization, after each optimizer step or before each forward, with `remap_state_dict` for checkpoints
across constrained and plain models; L1/L2 penalties and decoupled weight decay (`register_weight_decay`, on
post-accumulate-grad hooks); direct access without `.data` (`get_weights`, `set_weights_`, `init_weights_`,
`scale_weights_`); `UpdateRatioMonitor`; and detectors (`find_duplicate_units`, `DeadUnitDetector`,
`spectral_stats`, `weight_distance`). Layers are chosen with `select=` (a `hookscope.hooks` selector) and
every hook goes through its registry; what attaches returns a handle with `remove()` and `with` (`HookData` for
the dicts, `HandleGroup` for lists of hook handles); statistics stay on the device until read.
"""

# `name as name`: a name of the top level, whose one home is `hookscope` (see its `__init__`); it imports from
# here too, as it always has, and this package's `__all__` does not list it again.
from ._access import get_weights, init_weights_, scale_weights_, set_weights_
from ._change import add_weight_change_monitor_hook as add_weight_change_monitor_hook
from ._change import add_weight_distribution_monitor as add_weight_distribution_monitor
from ._change import compute_weight_changes as compute_weight_changes
from ._change import weight_distance
from ._constrain import ConstraintHandle, register_constraint, remap_state_dict
from ._constrain import add_weight_norm_constraint_hook as add_weight_norm_constraint_hook
from ._constraints import Clamp, MaxNorm, NonNeg, UnitNorm
from ._dead import DeadUnitDetector
from ._detect import detect_weight_symmetry_breaking as detect_weight_symmetry_breaking
from ._detect import find_duplicate_units, spectral_stats
from ._layers import HandleGroup, HookData
from ._ratio import UpdateRatioMonitor
from ._regularize import l1_penalty, l2_penalty, register_weight_decay
from ._summary import print_weight_summary as print_weight_summary
from ._updates import add_weight_update_monitor_hook as add_weight_update_monitor_hook
from ._updates import analyze_weight_updates as analyze_weight_updates
from ._updates import restore_optimizer_step as restore_optimizer_step

__all__ = [
    "Clamp",
    "ConstraintHandle",
    "DeadUnitDetector",
    "HandleGroup",
    "HookData",
    "MaxNorm",
    "NonNeg",
    "UnitNorm",
    "UpdateRatioMonitor",
    "find_duplicate_units",
    "get_weights",
    "init_weights_",
    "l1_penalty",
    "l2_penalty",
    "register_constraint",
    "register_weight_decay",
    "remap_state_dict",
    "scale_weights_",
    "set_weights_",
    "spectral_stats",
    "weight_distance",
]
