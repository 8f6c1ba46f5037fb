"""`summary(model, *args, **kwargs)`: one recorded forward (or none) turned into a `ModelSummary`."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn as nn

from .._check import DEVICE, checked
from .._errors import HookscopeWarning
from ..hooks._guards import check_hookable
from ..hooks._select import unwrap
from ._build import BuildOptions, build_summary, hook_labels, is_scripted, type_name, walk
from ._collect import MODES, run_forward
from ._columns import make_view
from ._inputs import example_inputs, needs_arguments
from ._memory import SavedTensors, check_optimizer, excluded_tensors, training_memory
from ._shapes import tensor_bytes
from ._table import ModelSummary

__all__ = ["summary"]


@checked(device=DEVICE)
def summary(
    model: nn.Module,
    *args: Any,
    input_size: Any = None,
    dtypes: Any = None,
    batch_dim: int | None = None,
    device: torch.device | str | None = None,
    depth: int | None = None,
    mode: str | None = None,
    columns: Any = None,
    widths: Any = None,
    param_rows: bool = False,
    depth_index: bool = False,
    order: str = "tree",
    with_backward: bool = False,
    optimizer: Any = None,
    progress: bool | None = None,
    **kwargs: Any,
) -> ModelSummary:
    """Run `model` once on example inputs and summarize every module: shapes, params, FLOPs, mode and hooks.

    The inputs are `model(*args, **kwargs)` as given (tensors, dicts, nested structures, `None`s), or tensors
    built from shapes: `input_size=(2, 3, 32, 32)`, a list of shapes for several positional inputs or a dict of
    shapes for keyword inputs (torchinfo's `input_size`), with `**kwargs` passed along. Float inputs
    are drawn from a private generator (the global RNG is untouched), integer inputs are zeros; `dtypes` sets
    them (one dtype, or one per input; `torch.long`, `torch.LongTensor` or `"int64"`). With `batch_dim`, the
    shapes leave out the batch dimension and a batch of one is inserted there. The forward runs once under
    `torch.no_grad()` and `FlopCounterMode`, in eval mode by default (`mode="train"` or `"same"`); afterwards
    each module's train/eval mode, buffers and the RNG state are as they were and the summary's hooks are gone,
    also when forward raises. Wrappers (DDP, torch.compile) are unwrapped and the eager module runs.

    Without inputs (and a forward that takes arguments), or for a model with no forward (an `nn.ModuleList`),
    nothing runs: the table lists the modules and parameters, the shape and FLOPs columns are empty and the
    header says why. TorchScript models and submodules are summarized from outside: their parameters and
    structure, and the calls eager code makes to them; uninitialized lazy parameters are flagged, not counted.

    Args:
        model: The model.
        *args: Positional inputs of `model.forward`.
        input_size: Shapes to build the inputs from, instead of giving them.
        dtypes: Dtype(s) of the inputs built from shapes (default float32).
        batch_dim: Where the batch dimension goes in the shapes of `input_size`, which then leave it out.
        device: Where to put the inputs (default: the model's device).
        depth: Default folding depth of the renderings (`None`: every module).
        mode: `"eval"`, `"train"` or `"same"` (the model's current modes); default `"eval"`, or `"train"`
            with `with_backward`/`optimizer`.
        columns: Columns after `Layer`, from `type`, `input_shape`, `output_shape`, `kernel_size`, `groups`,
            `params`, `params_percent`, `effective_params`, `trainable`, `flops`, `mode`, `hooks`.
        widths: Maximum widths of text columns, `{"layer": 40, "output_shape": 24}`; numbers are never cut.
        param_rows: Add a row per parameter under its module (name, shape, count), as torchinfo's `verbose=2`.
        depth_index: Label modules with torchinfo's `depth-index` (`: 2-3`).
        order: `"tree"` (registration order) or `"execution"` (order of first call).
        with_backward: Estimate the memory of a training step: run forward with gradients and count what
            autograd saves for backward, plus the gradients.
        optimizer: With it, add its state to the estimate: a `torch.optim` optimizer or a name (`"adam"`,
            `"sgd_momentum"`, ...; see `OPTIMIZER_STATES`). Implies `with_backward`.
        progress: Show the forward's progress (modules run / modules with a forward) on one line of stderr,
            cleared at the end: `None` on a terminal only (needs rich), `True` wherever rich can draw, `False`
            never. Nothing is drawn for a forward under half a second (GPT-2 large takes seconds on a CPU).
        **kwargs: Keyword inputs of `model.forward` (one named like an argument above, such as `mode` or
            `progress`, must be passed positionally).

    Returns:
        The `ModelSummary`; print it for the table.

    Raises:
        TypeError: `model` is not an `nn.Module`.
        ValueError: an argument is malformed (see the message for the fix).
        RuntimeError: forward failed; the message names the module that was running.

    Example:
        >>> import torch.nn as nn
        >>> s = summary(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), input_size=(3, 4))
        >>> s.total_params, s.total_flops, s["0"].output_shape
        (58, 312, torch.Size([3, 8]))
        >>> summary(nn.ModuleList([nn.Linear(4, 8)])).total_params
        40
    """
    if not is_scripted(model):
        check_hookable(model, "model")
    backward = _check_backward(with_backward, optimizer)
    run_mode = _check_mode(mode, backward)
    _check_depth(depth, batch_dim)
    view = make_view(columns=columns, widths=widths, param_rows=param_rows, depth_index=depth_index, order=order)
    root = unwrap(model)
    args, kwargs = example_inputs(root, args, kwargs, input_size, dtypes, device, batch_dim)
    reason = _no_run_reason(root, args, kwargs)
    if reason is not None and backward:
        raise ValueError(
            f"with_backward and optimizer need a forward run to see what backward keeps, but {reason}; give "
            "example inputs (or input_size)"
        )
    nodes = walk(root)
    hooks = hook_labels(root, nodes)
    modes = {id(node.module): node.module.training for node in nodes}
    paths = {id(n.module): n.path for n in nodes if n.same_as is None}
    saved = SavedTensors(excluded_tensors(root, (args, kwargs))) if backward else None
    try:
        run = None if reason is not None else run_forward(root, paths, args, kwargs, mode=run_mode, saved=saved,
                                                          progress=progress)  # fmt: skip
    except RuntimeError as err:
        if input_size is None or dtypes is not None or not _has_embedding(root):
            raise
        hint = "; the inputs were built as float32 from input_size: for token ids pass dtypes=torch.long"
        raise RuntimeError(f"{err}{hint} (CLI: --dtype long)") from err
    memory = None if saved is None else training_memory(root, saved, optimizer, tensor_bytes((args, kwargs)))
    options = BuildOptions(run_mode, depth, reason, batch_dim, memory, view)
    return build_summary(root, nodes, hooks, modes, run, (args, kwargs), options)


def _check_backward(with_backward: Any, optimizer: Any) -> bool:
    if not isinstance(with_backward, bool):
        raise ValueError(f"with_backward must be True or False, got {with_backward!r}")
    check_optimizer(optimizer)
    return with_backward or optimizer is not None


def _check_mode(mode: Any, backward: bool) -> str:
    if mode is None:
        return "train" if backward else "eval"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return str(mode)


def _check_depth(depth: Any, batch_dim: Any) -> None:
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
        raise ValueError(f"depth must be None or a non-negative int, got {depth!r}")
    if batch_dim is not None and (not isinstance(batch_dim, int) or isinstance(batch_dim, bool)):
        raise ValueError(f"batch_dim must be None or an int (a dimension index), got {batch_dim!r}")


def _has_embedding(model: nn.Module) -> bool:
    return any(isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for m in model.modules())


def _no_run_reason(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why the summary cannot run `model` (`None`: it can); warns when given inputs go unused."""
    if not is_scripted(model) and type(model).forward is nn.Module.forward:
        if args or kwargs:
            warnings.warn(
                f"{type_name(model)} has no forward (a container), so the example inputs were not used; the "
                "summary lists its modules and parameters. Summarize the model that calls it instead",
                HookscopeWarning,
                stacklevel=3,
            )
        return f"{type_name(model)} has no forward (a container)"
    if not args and not kwargs and needs_arguments(model):
        return "no example inputs were given (pass them, or input_size=...)"
    return None
