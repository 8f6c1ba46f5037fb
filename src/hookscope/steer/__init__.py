"""Steer: record, intervene on and patch any model's activations, in inference and in training.

`_sites.py` says what a site is (a module path, its output or first input) and places every steer hook through
`hookscope.hooks` (tagged `steer`: `list_hooks()` shows them, scopes and `remove_hooks` remove them, pickled
models get inert copies). `_record.py` records site values (`record`, `Recording`). `_interventions.py` holds the
interventions, frozen dataclasses (`Zero`, `Scale`, `Add`, `Replace`, `Mean`, `Clamp`, `Project`) that edit a
region chosen by `positions` and `heads`; `_intervene.py` applies them (`intervene`, the `Steering` handle).
`_patch.py` sweeps activation patching and attribution patching into a `PatchResult` (`_result.py`: table,
heatmap, notebook HTML). `_vector.py` computes steering vectors; `_spec.py` saves and loads
`{site: intervention}` specs as safetensors + JSON. Everything works on any `nn.Module`, plain, DDP-wrapped or
compiled after `intervene`.
"""

from ._intervene import Steering, intervene
from ._interventions import Add, Clamp, Intervention, Mean, Project, Replace, Scale, Zero
from ._patch import attribution_patch, patch
from ._record import Recording, record
from ._result import PatchResult
from ._spec import load, save
from ._vector import steering_vector

__all__ = [
    "Add",
    "Clamp",
    "Intervention",
    "Mean",
    "PatchResult",
    "Project",
    "Recording",
    "Replace",
    "Scale",
    "Steering",
    "Zero",
    "attribution_patch",
    "intervene",
    "load",
    "patch",
    "record",
    "save",
    "steering_vector",
]
