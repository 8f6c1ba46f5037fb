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
from ._columns import COLUMNS, TableView
from ._fit import shorten_end, shorten_middle, shorten_path
from ._flops import COUNTED_OPS, EXTRA_FLOP_FORMULAS
from ._inputs import to_dtype
from ._memory import OPTIMIZER_STATES, TrainingMemory
from ._params import ParamInfo
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
from ._shapes import ObjectShape
from ._table import LayerRow, ModelSummary, Trainable

__all__ = [
    "COLUMNS",
    "COUNTED_OPS",
    "EXTRA_FLOP_FORMULAS",
    "OPTIMIZER_STATES",
    "LayerRow",
    "ModelSummary",
    "ObjectShape",
    "ParamInfo",
    "TableView",
    "Trainable",
    "TrainingMemory",
    "dummy_eval",
    "format_bytes",
    "format_flops",
    "has_params",
    "layer_info",
    "model_sizes",
    "module_summary",
    "num_features_model",
    "shorten_end",
    "shorten_middle",
    "shorten_path",
    "summary",
    "to_dtype",
    "total_params",
]
