"""Model summaries: fastai's probes and a full table of every module (shapes, params, FLOPs, mode, hooks).

`summary(model, *args, **kwargs)` (`_api.py`) runs the model once with recording hooks (`_collect.py`) under
`torch.no_grad()` and `FlopCounterMode` (`_flops.py` adds the formulas for attention, normalizations and
activations, and turns off the fused kernels it cannot see), then builds one `LayerRow` per module path
(`_build.py`; parameters, pruning masks and lazy modules in `_params.py`) into a `ModelSummary` (`_table.py`).
Without inputs or a forward it runs nothing and lists the parameters. `with_backward`/`optimizer` add a training
memory estimate (`_memory.py`). Renderings are pure: `_columns.py` (the columns and view options), `_cells.py`
(lines and cells), `_fit.py` (shortening paths and names to fit a width, never numbers), `_render.py` (text
and rich) and `_html.py` (the notebook's HTML table and the one-line repr). Inputs are given or built from
shapes (`_inputs.py`); shapes of nested values are described by `_shapes.py`. The fastai probes live in
`_probes.py` and use the same recorder. Hooks go through `hookscope.hooks` only and are removed, and every
module's train/eval mode restored, even when forward raises.

`hookscope.summary` (the attribute of the top-level package) is the function; import the rest from here:
`from hookscope.summary import ModelSummary, layer_info`.
"""

from ._api import summary
from ._probes import (
    dummy_eval,
    has_params,
    layer_info,
    model_sizes,
    module_summary,
    num_features_model,
    total_params,
)
from ._table import ModelSummary

__all__ = [
    "ModelSummary",
    "dummy_eval",
    "has_params",
    "layer_info",
    "model_sizes",
    "module_summary",
    "num_features_model",
    "summary",
    "total_params",
]
