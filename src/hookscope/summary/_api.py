"""`summary(model, *args, **kwargs)`: one recorded forward turned into a `ModelSummary`."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .._check import DEVICE, checked
from ..hooks import check_hookable, unwrap
from ._build import build_summary, hook_labels, walk
from ._collect import run_forward
from ._inputs import example_inputs
from ._table import ModelSummary

__all__ = ["summary"]


@checked(device=DEVICE)
def summary(
    model: nn.Module,
    *args: Any,
    input_size: Any = None,
    input_shape: Any = None,
    dtypes: Any = None,
    device: torch.device | str | None = None,
    depth: int | None = None,
    mode: str = "eval",
    **kwargs: Any,
) -> ModelSummary:
    """Run `model` once on example inputs and summarize every module: shapes, params, FLOPs, mode and hooks.

    The inputs are `model(*args, **kwargs)` as given (tensors, dicts, nested structures, `None`s), or tensors
    built from shapes: `input_size=(2, 3, 32, 32)`, a list of shapes for several positional inputs or a dict of
    shapes for keyword inputs (`input_shape=` is the same argument). Float inputs are drawn from a private
    generator (the global RNG is untouched), integer inputs are zeros; `dtypes` sets them (one dtype, or one per
    input). The forward runs once under `torch.no_grad()` and `FlopCounterMode`, in eval mode by default
    (`mode="train"` or `"same"`); afterwards each module's train/eval mode, buffers and the RNG state are as they
    were and the summary's hooks are gone, also when forward raises. Wrappers (DDP, torch.compile) are unwrapped
    and the eager module runs.

    Args:
        model: The model.
        *args: Positional inputs of `model.forward`.
        input_size: Shapes to build the inputs from, instead of giving them.
        input_shape: Alias of `input_size`.
        dtypes: Dtype(s) of the inputs built from shapes (default float32).
        device: Where to put the inputs (default: the model's device).
        depth: Default folding depth of the renderings (`None`: every module).
        mode: `"eval"`, `"train"` or `"same"` (the model's current modes).
        **kwargs: Keyword inputs of `model.forward`.

    Returns:
        The `ModelSummary`; print it for the table.

    Raises:
        TypeError: `model` is not an `nn.Module` or is a TorchScript module.
        ValueError: an argument is malformed (see the message for the fix).
        RuntimeError: forward failed; the message names the module that was running.

    Example:
        >>> import torch.nn as nn
        >>> s = summary(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), input_size=(3, 4))
        >>> s.total_params, s.total_flops, s["0"].output_shape
        (58, 288, torch.Size([3, 8]))
    """
    check_hookable(model, "model")
    if input_shape is not None:
        if input_size is not None:
            raise ValueError(f"input_shape is an alias of input_size: give one, got both ({input_shape!r})")
        input_size = input_shape
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
        raise ValueError(f"depth must be None or a non-negative int, got {depth!r}")
    root = unwrap(model)
    args, kwargs = example_inputs(root, args, kwargs, input_size, dtypes, device)
    nodes = walk(root)
    hooks = hook_labels(root, nodes)
    modes = {id(node.module): node.module.training for node in nodes}
    paths = {id(n.module): n.path for n in nodes if n.same_as is None}
    run = run_forward(root, paths, args, kwargs, mode=mode)
    return build_summary(root, nodes, hooks, modes, run, (args, kwargs), mode, depth)
