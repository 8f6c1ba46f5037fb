"""fastai's model probes, same names and behaviour: parameters, dummy evaluation, sizes, layer table.

Every probe that runs the model runs it once, in eval mode and without gradients, through the same recorder as
`summary`, and leaves each module's train/eval mode as it found it, also when forward fails.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .._check import checked
from ..hooks._guards import check_hookable
from ..hooks._select import unwrap
from ..hooks._tree import map_tensors, tensor_leaves
from ._build import walk
from ._collect import CallRecord, restored_modes, run_forward
from ._shapes import as_lists

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


def _leaf_calls(model: nn.Module, xb: tuple[Any, ...]) -> list[tuple[nn.Module, CallRecord]]:
    check_hookable(model, "model")
    root = unwrap(model)
    leaves = {id(n.module): n for n in walk(root) if n.same_as is None and next(n.module.children(), None) is None}
    run = run_forward(root, {key: n.path for key, n in leaves.items()}, xb, {}, count_flops=False)
    return [(leaves[call.module_id].module, call) for call in run.calls]


LayerInfo = tuple[str, int | str, bool | str, Any, bool]


@checked()
def layer_info(model: nn.Module, *xb: Any) -> list[LayerInfo]:
    """Return fastai's `(type name, params, trainable, output shape, same)` per leaf-module call, in forward order.

    As fastai: `params` and `trainable` come from `total_params` for a layer with a `weight` attribute and are `''`
    for the others (activations, pooling, `Flatten`); `same` says whether the layer kept the shape of an input
    (fastai's test: some input `i[k]` with `i[k].shape[1:] == o[k].shape`). Shapes are lists (nested for nested
    outputs). Computed on the first sample of the batch (batch dimension 1), in eval mode without gradients; the
    modes are restored after. Unlike fastai (one row per hooked module, its last call), a module called twice
    gives two rows.

    Example:
        >>> import torch
        >>> layer_info(nn.Sequential(nn.Linear(1, 2), nn.ReLU()), torch.zeros(8, 1))
        [('Linear', 4, True, [1, 2], False), ('ReLU', '', '', [1, 2], True)]
    """
    batch = map_tensors(xb, lambda t: t[:1] if t.dim() > 0 else t)
    return [_info(m, call) for m, call in _leaf_calls(model, batch)]


def _info(module: nn.Module, call: CallRecord) -> LayerInfo:
    params, trainable = total_params(module) if hasattr(module, "weight") else ("", "")
    return (type(module).__name__, params, trainable, as_lists(call.output_shape), _same(call))


def _same(call: CallRecord) -> bool:
    """fastai's flag: `any(i[k].shape[1:] == o[k].shape)` over the inputs `i` and the items `o[k]` of the output."""
    inputs, output = call.input_shape, call.output_shape
    inputs = [inputs] if isinstance(inputs, torch.Size) else list(inputs) if isinstance(inputs, tuple) else []
    if isinstance(output, torch.Size):
        items = [output[1:]] * (output[0] if len(output) else 0)  # o[k] of a tensor: one row
    else:
        items = list(output) if isinstance(output, tuple) else []
    pairs = zip(inputs, items, strict=False)
    return any(isinstance(i, torch.Size) and isinstance(o, torch.Size) and i[1:] == o for i, o in pairs)


def _fastai_shape(description: Any, batch_size: int) -> str:
    """fastai's `_print_shapes`: a shape with the real batch size, `16 x 50`; the first one of a tuple."""
    if isinstance(description, torch.Size):
        return " x ".join([str(batch_size)] + [str(d) for d in description[1:]])
    if isinstance(description, tuple) and description:
        first = description[0]
        first = next(iter(first.values()), ()) if isinstance(first, dict) and first else first
        if isinstance(first, tuple):
            return " x ".join([str(batch_size)] + [str(d) for d in first[1:]])
    if isinstance(description, dict) and description:
        return _fastai_shape(next(iter(description.values())), batch_size)
    return str(description)


def _batch_size(xb: tuple[Any, ...]) -> int:
    for _, tensor in tensor_leaves(xb):
        return int(tensor.shape[0]) if tensor.dim() else 1
    return 1


@checked()
def module_summary(model: nn.Module, *xb: Any) -> str:
    """Return fastai's printable table for `model` on the batch `xb`, and its parameter totals, as fastai prints it.

    The text is fastai's to the character (padded columns with their trailing spaces, a blank line at the end):
    one line per leaf-module call (layer type, params, trainable), a new group with the output shape (batch size
    from `xb`, the first input's shape in the title) wherever a layer changes the shape. Unlike fastai, the totals
    count every parameter of the model once, also those of modules that are not leaves (fastai misses them).
    """
    calls = [(call, _info(module, call)) for module, call in _leaf_calls(model, xb)]
    batch_size = _batch_size(xb)
    shapes = tuple(t.shape if isinstance(t, torch.Tensor) else t for t in xb)
    text = f"{type(unwrap(model)).__name__} (Input shape: {_fastai_shape(shapes, batch_size)})\n"
    text += "=" * _WIDTH + "\n"
    text += f"{'Layer (type)':<20} {'Output Shape':<20} {'Param #':<10} {'Trainable':<10}\n"
    text += "=" * _WIDTH
    previous: Any = None
    for index, (call, (name, params, trainable, _, same)) in enumerate(calls):
        shape = call.output_shape
        if index == 0:
            text += f"\n{'':<20} {_fastai_shape(shape, batch_size)[:19]:<20}"
        elif not same and previous != shape:
            text += "\n" + "_" * _WIDTH + "\n" + f"{'':<20} {_fastai_shape(shape, batch_size)[:19]:<20}"
        text += f"\n{name:<20} {'':<20} {params:<10} {trainable!s:<10}"
        previous = shape
    count, _ = total_params(model)
    trainable_count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    text += "\n" + "_" * _WIDTH + "\n"
    text += f"\nTotal params: {count:,}\n"
    text += f"Total trainable params: {trainable_count:,}\n"
    text += f"Total non-trainable params: {count - trainable_count:,}\n\n"
    return text
