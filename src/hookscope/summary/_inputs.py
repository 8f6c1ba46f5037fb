"""Example inputs for a summary: given tensors (moved to a device on request) or built from shapes.

Dtypes are read by `to_dtype`, the one parser for them (the CLI's `--dtype` uses it too): a `torch.dtype`, a
legacy tensor type (`torch.FloatTensor`, `torch.cuda.LongTensor`), a Python type (`float`, `int`, `bool`) or a
name (`"long"`, `"int64"`, `"torch.float16"`).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn

from ..hooks._tree import map_tensors

__all__ = ["example_inputs", "model_device", "needs_arguments", "to_dtype"]

_SHAPE_HELP = (
    "a shape such as (2, 3, 32, 32), a list of shapes (one per positional input) or a dict of shapes "
    "(one per keyword input)"
)


def model_device(model: nn.Module) -> torch.device:
    """Return the device of the first parameter or buffer of `model` (the CPU if it has none)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


_DTYPE_HELP = "a torch.dtype, a tensor type such as torch.LongTensor, or a name such as 'float32' or 'long'"
_PYTHON_TYPES = {float: torch.float32, int: torch.int64, bool: torch.bool, complex: torch.complex64}


def to_dtype(value: Any, argument: str = "dtypes") -> torch.dtype:
    """Return the `torch.dtype` that `value` names.

    Example:
        >>> to_dtype(torch.LongTensor), to_dtype("half"), to_dtype("torch.int32"), to_dtype(float)
        (torch.int64, torch.float16, torch.int32, torch.float32)

    Raises:
        ValueError: `value` names no dtype (the message names `argument`).
    """
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, type) and value in _PYTHON_TYPES:
        return _PYTHON_TYPES[value]
    legacy = getattr(value, "dtype", None)  # torch.FloatTensor & co. are classes with a dtype attribute
    if isinstance(value, type) and isinstance(legacy, torch.dtype):
        return legacy
    if isinstance(value, str):
        found = getattr(torch, value.strip().removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
    raise ValueError(f"{argument} must be {_DTYPE_HELP}, got {value!r}")


def example_inputs(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    input_size: Any,
    dtypes: Any,
    device: torch.device | str | None,
    batch_dim: int | None = None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return the `(args, kwargs)` to call `model` with.

    With `input_size`, the inputs built from it come first (positional for a shape or a list of shapes, keyword
    for a dict) and `kwargs` are passed along; with `batch_dim`, each shape lacks the batch dimension and a batch
    of one is inserted there.

    Raises:
        ValueError: positional inputs were given with `input_size`, a keyword is given twice, or a shape, dtype
            or `batch_dim` is malformed.
    """
    target = torch.device(device) if device is not None else None
    if target is not None:
        args, kwargs = map_tensors(args, lambda t: t.to(target)), map_tensors(kwargs, lambda t: t.to(target))
    if input_size is None:
        if batch_dim is not None:
            raise ValueError(
                f"batch_dim is for shapes given without their batch dimension, got batch_dim={batch_dim!r} without "
                "input_size; give input_size=(...) without the batch dimension, or drop batch_dim"
            )
        return args, kwargs
    if args:
        raise ValueError(
            f"pass either positional example inputs or input_size, got both (input_size={input_size!r}); drop one "
            "of them (keyword inputs may go with input_size)"
        )
    built_args, built_kwargs = _from_shapes(input_size, dtypes, target or model_device(model), batch_dim)
    twice = sorted(set(built_kwargs) & set(kwargs))
    if twice:
        raise ValueError(f"input_size and the keyword inputs both give {twice}; give each input once")
    return built_args, {**built_kwargs, **kwargs}


def needs_arguments(model: nn.Module) -> bool:
    """Whether `model.forward` declares any parameter (TorchScript and unreadable signatures: assumed so)."""
    if isinstance(model, torch.jit.ScriptModule):
        return True
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return True
    return bool(parameters)


def _is_shape(value: Any) -> bool:
    return isinstance(value, (tuple, list, torch.Size)) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    )


def _from_shapes(
    input_size: Any, dtypes: Any, device: torch.device, batch_dim: int | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    generator = torch.Generator().manual_seed(0)  # the user's RNG stream stays untouched
    if isinstance(input_size, dict):
        kinds = _dtypes(dtypes, list(input_size))
        return (), {k: _tensor(k, s, kinds[k], device, generator, batch_dim) for k, s in input_size.items()}
    shapes: Sequence[Any] = [input_size] if _is_shape(input_size) else input_size
    if not isinstance(shapes, (tuple, list)):
        raise ValueError(f"input_size must be {_SHAPE_HELP}, got {input_size!r}")
    kinds = _dtypes(dtypes, list(range(len(shapes))))
    return tuple(_tensor(i, s, kinds[i], device, generator, batch_dim) for i, s in enumerate(shapes)), {}


def _is_single_dtype(dtypes: Any) -> bool:
    return not isinstance(dtypes, (dict, list, tuple))


def _dtypes(dtypes: Any, keys: list[Any]) -> dict[Any, torch.dtype]:
    if dtypes is None:
        return dict.fromkeys(keys, torch.float32)
    if _is_single_dtype(dtypes):
        return dict.fromkeys(keys, to_dtype(dtypes))
    values = [dtypes.get(k, torch.float32) for k in keys] if isinstance(dtypes, dict) else list(dtypes)
    if len(values) != len(keys):
        raise ValueError(
            f"dtypes must be one dtype, or one dtype per input ({len(keys)} here, a list or a dict like "
            f"input_size), got {dtypes!r}"
        )
    return {key: to_dtype(value) for key, value in zip(keys, values, strict=True)}


def _tensor(
    key: Any, shape: Any, dtype: torch.dtype, device: torch.device, generator: torch.Generator, batch_dim: int | None
) -> Any:
    if not _is_shape(shape) or any(d < 0 for d in shape):
        raise ValueError(f"input_size must be {_SHAPE_HELP} of non-negative ints, got {shape!r} for input {key!r}")
    if batch_dim is not None:
        if not -len(shape) - 1 <= batch_dim <= len(shape):
            raise ValueError(
                f"batch_dim must be a dimension of the input with its batch dimension ({len(shape) + 1} dims for "
                f"input {key!r} of shape {tuple(shape)!r}), got {batch_dim!r}"
            )
        shape = list(shape)
        shape.insert(batch_dim if batch_dim >= 0 else len(shape) + 1 + batch_dim, 1)
    if device.type == "meta":
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.rand(tuple(shape), generator=generator).to(device=device, dtype=dtype)
    return torch.zeros(tuple(shape), dtype=dtype, device=device)
