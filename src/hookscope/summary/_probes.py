"""fastai's model probes, same names and behaviour: parameters, dummy evaluation, sizes, layer table.

Every probe that runs the model runs it once, in eval mode and without gradients, through the same recorder as
`summary`, and leaves each module's train/eval mode as it found it, also when forward fails.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .._check import checked
from ..hooks import check_hookable, map_tensors, unwrap
from ._build import walk
from ._collect import restored_modes, run_forward
from ._shapes import as_lists, format_shape

__all__ = [
    "dummy_eval",
    "has_params",
    "layer_info",
    "model_sizes",
    "module_summary",
    "num_features_model",
    "total_params",
]

_WIDTH = 76
_SIZES = (32, 64, 128, 256, 512, 1024, 2048)


@checked()
def has_params(m: nn.Module) -> bool:
    """Return whether `m` has at least one parameter (its submodules' count).

    Example:
        >>> has_params(nn.LSTM(2, 3)), has_params(nn.ReLU())
        (True, False)
    """
    return next(iter(m.parameters()), None) is not None


@checked()
def total_params(m: nn.Module) -> tuple[int, bool]:
    """Return the number of parameters of `m` (each counted once) and whether any of them is trainable.

    Example:
        >>> total_params(nn.Linear(10, 32)), total_params(nn.BatchNorm2d(20, affine=False))
        ((352, True), (0, False))
    """
    parameters = list(m.parameters())
    return sum(p.numel() for p in parameters), any(p.requires_grad for p in parameters)


def _in_channels(m: nn.Module) -> int:
    for module in m.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() >= 2:
            channels = getattr(module, "in_channels", getattr(module, "in_features", weight.shape[1]))
            return int(channels)
    raise ValueError(
        f"m must contain a layer with a weight of 2 or more dimensions (a Conv or Linear) to infer the input "
        f"channels from, got a {type(m).__name__} with none; build the input yourself and call the model on it"
    )


def _dummy_input(m: nn.Module, size: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(size, (tuple, list)) or not all(isinstance(s, int) and s > 0 for s in size):
        raise ValueError(f"size must be a tuple of positive ints (the spatial size), got {size!r}")
    reference = next(iter(m.parameters()), None)
    dtype = reference.dtype if reference is not None else torch.float32
    device = reference.device if reference is not None else torch.device("cpu")
    return torch.zeros(1, _in_channels(m), *size, dtype=dtype, device=device)


@checked()
def dummy_eval(m: nn.Module, size: tuple[int, ...] = (64, 64)) -> Any:
    """Evaluate `m` in eval mode without gradients on a zero batch of one, then restore its train/eval mode.

    The input has the input channels of `m`'s first weighted layer and spatial `size`: shape `(1, C, *size)`.

    Raises:
        ValueError: `m` has no layer with a 2-D or higher weight, or `size` is malformed.
    """
    check_hookable(m, "m")
    x = _dummy_input(m, size)
    with restored_modes(m), torch.no_grad():
        return m.eval()(x)


@checked()
def model_sizes(m: nn.Module, size: tuple[int, ...] = (64, 64)) -> list[Any]:
    """Return the output shape of each child of `m` (of `m` itself if it has none) on `dummy_eval`'s input.

    A child called several times gives the shape of its last call; a child never called is left out. Nested
    outputs give nested lists.

    Raises:
        ValueError: as `dummy_eval`.
        RuntimeError: forward failed (the message names the module that was running).
    """
    check_hookable(m, "m")
    root = unwrap(m)
    children = list(root.children()) or [root]
    paths = {id(child): name for name, child in root.named_children()} or {id(root): ""}
    run = run_forward(root, paths, (_dummy_input(root, size),), {}, count_flops=False)
    last = {call.module_id: call.output_shape for call in run.calls}
    return [as_lists(last[id(child)]) for child in children if id(child) in last]


@checked()
def num_features_model(m: nn.Module) -> int:
    """Return the number of output features (channels) of `m`, trying inputs of 32x32 up to 2048x2048.

    Raises:
        ValueError: as `dummy_eval`.
        RuntimeError: the model ran on none of the sizes; the message names the last failure, which is chained.
    """
    _in_channels(m)
    failure: Exception | None = None
    for size in _SIZES:
        try:
            return int(model_sizes(m, (size, size))[-1][1])
        except Exception as err:
            failure = err
    raise RuntimeError(
        f"num_features_model could not run m ({type(m).__name__}) on any input of {_SIZES[0]}x{_SIZES[0]} to "
        f"{_SIZES[-1]}x{_SIZES[-1]}; the last failure (at {_SIZES[-1]}x{_SIZES[-1]}) was "
        f"{type(failure).__name__}: {failure}"
    ) from failure


def _leaf_calls(model: nn.Module, xb: tuple[Any, ...]) -> list[tuple[nn.Module, Any]]:
    check_hookable(model, "model")
    root = unwrap(model)
    leaves = {id(n.module): n for n in walk(root) if n.same_as is None and next(n.module.children(), None) is None}
    run = run_forward(root, {key: n.path for key, n in leaves.items()}, xb, {}, count_flops=False)
    return [(leaves[call.module_id].module, call.output_shape) for call in run.calls]


@checked()
def layer_info(model: nn.Module, *xb: Any) -> list[tuple[str, int, bool, Any]]:
    """Return `(type name, params, trainable, output shape as a list)` per leaf-module call, in forward order.

    Computed on the first sample of the batch (batch dimension 1), in eval mode without gradients; the modes
    are restored after.

    Example:
        >>> import torch
        >>> layer_info(nn.Sequential(nn.Linear(1, 2), nn.ReLU()), torch.zeros(8, 1))
        [('Linear', 4, True, [1, 2]), ('ReLU', 0, False, [1, 2])]
    """
    batch = map_tensors(xb, lambda t: t[:1] if t.dim() > 0 else t)
    return [(type(m).__name__, *total_params(m), as_lists(shape)) for m, shape in _leaf_calls(model, batch)]


def _times(description: Any) -> str:
    if isinstance(description, torch.Size):
        return " x ".join(str(d) for d in description)
    return format_shape(description, sep=" x ")


@checked()
def module_summary(model: nn.Module, *xb: Any) -> str:
    """Return fastai's printable table for `model` on the batch `xb`, and its parameter totals.

    One line per leaf-module call (layer type, params, trainable), grouped under the output shape with the real
    batch size; totals count every parameter of the model once (shared ones too, and those of non-leaf modules).
    """
    calls = _leaf_calls(model, xb)
    inputs = ", ".join(_times(t.shape) if isinstance(t, torch.Tensor) else format_shape(t) for t in xb)
    lines = [f"{type(unwrap(model)).__name__} (Input shape: {inputs})", "=" * _WIDTH]
    lines += [f"{'Layer (type)':<20} {'Output Shape':<20} {'Param #':<10} {'Trainable':<10}", "=" * _WIDTH]
    previous: Any = object()
    for index, (module, shape) in enumerate(calls):
        if shape != previous:
            lines += ([] if index == 0 else ["_" * _WIDTH]) + [f"{'':<20} {_times(shape):<20}"]
        count, trainable = total_params(module)
        params, flag = (f"{count}", str(trainable)) if count else ("", "")
        lines.append(f"{type(module).__name__:<20} {'':<20} {params:<10} {flag:<10}")
        previous = shape
    count, _ = total_params(model)
    trainable_count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    lines += ["_" * _WIDTH, "", f"Total params: {count:,}", f"Total trainable params: {trainable_count:,}"]
    lines.append(f"Total non-trainable params: {count - trainable_count:,}")
    return "\n".join(line.rstrip() for line in lines) + "\n"
