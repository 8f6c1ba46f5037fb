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

`hookscope.summary` (the attribute of the top-level package) is the function; it and the fastai probes are
imported from the top level (`from hookscope import summary, layer_info`), `ModelSummary` from here.
"""

# `name as name`: a name of the top level, whose one home is `hookscope` (see its `__init__`); it imports from
# here too, as it always has, and this package's `__all__` does not list it again.
from ._api import summary as summary
from ._probes import dummy_eval as dummy_eval
from ._probes import has_params as has_params
from ._probes import layer_info as layer_info
from ._probes import model_sizes as model_sizes
from ._probes import module_summary as module_summary
from ._probes import num_features_model as num_features_model
from ._probes import total_params as total_params
from ._table import ModelSummary

__all__ = [
    "ModelSummary",
]
