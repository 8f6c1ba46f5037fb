"""Example inputs for a summary: given tensors (moved to a device on request) or built from shapes."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn

from ..hooks import map_tensors

__all__ = ["example_inputs", "model_device"]

_SHAPE_HELP = (
    "a shape such as (2, 3, 32, 32), a list of shapes (one per positional input) or a dict of shapes "
    "(one per keyword input)"
)


def model_device(model: nn.Module) -> torch.device:
    """Return the device of the first parameter or buffer of `model` (the CPU if it has none)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def example_inputs(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    input_size: Any,
    dtypes: Any,
    device: torch.device | str | None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return the `(args, kwargs)` to call `model` with.

    Raises:
        ValueError: both inputs and `input_size` were given, neither was and forward needs arguments, or a
            shape or dtype is malformed.
    """
    if input_size is None:
        if not args and not kwargs and _needs_arguments(model):
            raise ValueError(
                "summary needs example inputs: pass them as arguments (summary(model, x, mask=m)) or give their "
                "shapes (summary(model, input_size=(1, 3, 224, 224))), got neither"
            )
        if device is None:
            return args, kwargs
        target = torch.device(device)
        return map_tensors(args, lambda t: t.to(target)), map_tensors(kwargs, lambda t: t.to(target))
    if args or kwargs:
        raise ValueError(
            f"pass either example inputs or input_size, got both (input_size={input_size!r}); drop one of them"
        )
    target = torch.device(device) if device is not None else model_device(model)
    return _from_shapes(input_size, dtypes, target)


def _needs_arguments(model: nn.Module) -> bool:
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return any(p.default is inspect.Parameter.empty and p.kind not in variadic for p in parameters)


def _is_shape(value: Any) -> bool:
    return isinstance(value, (tuple, list, torch.Size)) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    )


def _from_shapes(input_size: Any, dtypes: Any, device: torch.device) -> tuple[tuple[Any, ...], dict[str, Any]]:
    generator = torch.Generator().manual_seed(0)  # the user's RNG stream stays untouched
    if isinstance(input_size, dict):
        kinds = _dtypes(dtypes, list(input_size))
        return (), {k: _tensor(k, s, kinds[k], device, generator) for k, s in input_size.items()}
    shapes: Sequence[Any] = [input_size] if _is_shape(input_size) else input_size
    if not isinstance(shapes, (tuple, list)):
        raise ValueError(f"input_size must be {_SHAPE_HELP}, got {input_size!r}")
    kinds = _dtypes(dtypes, list(range(len(shapes))))
    return tuple(_tensor(i, s, kinds[i], device, generator) for i, s in enumerate(shapes)), {}


def _dtypes(dtypes: Any, keys: list[Any]) -> dict[Any, torch.dtype]:
    if dtypes is None or isinstance(dtypes, torch.dtype):
        return dict.fromkeys(keys, dtypes or torch.float32)
    values = [dtypes.get(k, torch.float32) for k in keys] if isinstance(dtypes, dict) else list(dtypes)
    if len(values) != len(keys) or not all(isinstance(v, torch.dtype) for v in values):
        raise ValueError(
            f"dtypes must be a torch.dtype, or one dtype per input ({len(keys)} here, a list or a dict like "
            f"input_size), got {dtypes!r}"
        )
    return dict(zip(keys, values, strict=True))


def _tensor(key: Any, shape: Any, dtype: torch.dtype, device: torch.device, generator: torch.Generator) -> Any:
    if not _is_shape(shape) or any(d < 0 for d in shape):
        raise ValueError(f"input_size must be {_SHAPE_HELP} of non-negative ints, got {shape!r} for input {key!r}")
    if device.type == "meta":
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.rand(tuple(shape), generator=generator).to(device=device, dtype=dtype)
    return torch.zeros(tuple(shape), dtype=dtype, device=device)
