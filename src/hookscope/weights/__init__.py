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

from ._access import get_weights, init_weights_, scale_weights_, set_weights_
from ._change import (
    add_weight_change_monitor_hook,
    add_weight_distribution_monitor,
    compute_weight_changes,
    weight_distance,
)
from ._constrain import ConstraintHandle, add_weight_norm_constraint_hook, register_constraint, remap_state_dict
from ._constraints import Clamp, MaxNorm, NonNeg, UnitNorm
from ._dead import DeadUnitDetector
from ._detect import detect_weight_symmetry_breaking, find_duplicate_units, spectral_stats
from ._layers import HandleGroup, HookData
from ._ratio import UpdateRatioMonitor
from ._regularize import l1_penalty, l2_penalty, register_weight_decay
from ._summary import print_weight_summary
from ._updates import add_weight_update_monitor_hook, analyze_weight_updates, restore_optimizer_step

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
    "add_weight_change_monitor_hook",
    "add_weight_distribution_monitor",
    "add_weight_norm_constraint_hook",
    "add_weight_update_monitor_hook",
    "analyze_weight_updates",
    "compute_weight_changes",
    "detect_weight_symmetry_breaking",
    "find_duplicate_units",
    "get_weights",
    "init_weights_",
    "l1_penalty",
    "l2_penalty",
    "print_weight_summary",
    "register_constraint",
    "register_weight_decay",
    "remap_state_dict",
    "restore_optimizer_step",
    "scale_weights_",
    "set_weights_",
    "spectral_stats",
    "weight_distance",
]
