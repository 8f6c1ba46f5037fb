"""Model summaries: fastai's probes and a full table of every module (shapes, params, FLOPs, mode, hooks).

`summary(model, *args, **kwargs)` runs the model once with recording hooks (`_collect.py`) under
`torch.no_grad()` and `FlopCounterMode` (`_flops.py` adds the formulas and turns off the fused kernels it cannot
see), then builds one `LayerRow` per module path (`_build.py`) into a `ModelSummary` (`_table.py`) that renders as
text or with rich (`_render.py`, pure formatting). Inputs are given or built from shapes (`_inputs.py`); shapes of
nested values are described by `_shapes.py`. The fastai probes (`has_params`, `total_params`, `dummy_eval`,
`model_sizes`, `num_features_model`, `layer_info`, `module_summary`) live in `_probes.py` and use the same
recorder. Hooks go through `hookscope.hooks` only and are removed, and every module's train/eval mode restored,
even when forward raises. Nothing here depends on monitors or callbacks.

`hookscope.summary` (the attribute of the top-level package) is the function; import the rest from here:
`from hookscope.summary import ModelSummary, layer_info`.
"""

from ._api import summary
from ._flops import EXTRA_FLOP_FORMULAS
from ._probes import (
    dummy_eval,
    has_params,
    layer_info,
    model_sizes,
    module_summary,
    num_features_model,
    total_params,
)
from ._render import format_bytes, format_flops
from ._table import LayerRow, ModelSummary, Trainable

__all__ = [
    "EXTRA_FLOP_FORMULAS",
    "LayerRow",
    "ModelSummary",
    "Trainable",
    "dummy_eval",
    "format_bytes",
    "format_flops",
    "has_params",
    "layer_info",
    "model_sizes",
    "module_summary",
    "num_features_model",
    "summary",
    "total_params",
]
