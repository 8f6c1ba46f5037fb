"""Load what `hookscope summary TARGET` summarizes: a factory by import path or file path, or a trusted file."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ._errors import UsageError

__all__ = ["load_target", "parse_columns", "parse_dtypes", "parse_shapes"]

_FORM = "TARGET must be package.module:factory or path/to/file.py:factory"


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """Parse `--input-shape`: `1,3,32,32`, or several inputs separated by `;` (`1,10;1,5`).

    Raises:
        UsageError: a dimension is not a positive int.
    """
    shapes = []
    for part in text.split(";"):
        try:
            shape = tuple(int(dim) for dim in part.replace("x", ",").split(","))
        except ValueError:
            shape = ()
        if not shape or any(dim < 1 for dim in shape):
            raise UsageError(f"--input-shape must be comma-separated positive ints like 1,3,32,32, got {text!r}")
        shapes.append(shape)
    return shapes


def parse_dtypes(text: str | None, inputs: int) -> Any:
    """Parse `--dtype`: one dtype for every input (`long`, `int64`, `torch.float16`), or one per input (`long;float`).

    Raises:
        UsageError: a name is no dtype, there is no `--input-shape` to apply it to, or the count is off.
    """
    from ..summary._inputs import to_dtype

    if text is None:
        return None
    if inputs == 0:
        raise UsageError(f"--dtype needs --input-shape (the dtype is that of the example inputs), got --dtype {text}")
    try:
        dtypes = [to_dtype(part, "--dtype") for part in text.replace(",", ";").split(";")]
    except ValueError as err:
        raise UsageError(str(err)) from err
    if len(dtypes) == 1:
        return dtypes[0]
    if len(dtypes) != inputs:
        raise UsageError(f"--dtype must give one dtype, or one per input ({inputs} here), got {text!r}")
    return dtypes


def parse_columns(text: str) -> list[str]:
    """Parse `--columns`: comma-separated column names (checked by `summary`)."""
    from ..summary._columns import COLUMNS

    names = [part.strip() for part in text.split(",") if part.strip()]
    choices = [name for name in COLUMNS if name != "layer"]
    if not names or any(name not in choices for name in names):
        raise UsageError(f"--columns must be comma-separated names from {', '.join(choices)}, got {text!r}")
    return names


def load_target(target: str, *, trust: bool = False) -> nn.Module:
    """Build the model `target` names: call the factory (or take the module it names).

    Raises:
        UsageError: the target is malformed, missing, not a module, or a saved model without `trust`.
    """
    location, sep, attribute = target.rpartition(":")
    if not sep:
        return _load_file_model(Path(target), trust)
    if not location or not attribute:
        raise UsageError(f"{_FORM}, got {target!r}")
    source = _load_source(location, target)
    obj: Any = source
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"TARGET {target!r}: {location!r} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    model = obj if isinstance(obj, nn.Module) else _call(obj, target)
    if not isinstance(model, nn.Module):
        raise UsageError(f"TARGET {target!r} must return a torch.nn.Module, got {type(model).__name__}")
    return model


def _call(factory: Any, target: str) -> Any:
    if not callable(factory):
        raise UsageError(f"TARGET {target!r} must name a callable that returns a module, got {type(factory).__name__}")
    return factory()


def _load_source(location: str, target: str) -> Any:
    if location.endswith(".py") or "/" in location or "\\" in location:
        return _import_file(Path(location), target)
    try:
        return importlib.import_module(location)
    except ModuleNotFoundError as err:
        raise UsageError(f"TARGET {target!r}: cannot import {location!r} ({err}); is it on PYTHONPATH?") from err


def _import_file(path: Path, target: str) -> Any:
    if not path.is_file():
        raise UsageError(f"TARGET {target!r}: file {str(path)!r} does not exist")
    name = f"_hookscope_target_{abs(hash(path.resolve()))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"TARGET {target!r}: {str(path)!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.resolve().parent))  # so the file can import its neighbours
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.resolve().parent))
    return module


def _load_file_model(path: Path, trust: bool) -> nn.Module:
    if not path.is_file():
        raise UsageError(f"{_FORM} (or a saved model file with --trust), got {str(path)!r}")
    if path.suffix == ".py":
        raise UsageError(f"{_FORM}: name the factory in {str(path)!r}, e.g. {path!s}:build_model")
    if not trust:
        raise UsageError(
            f"TARGET {str(path)!r} is a saved model file: loading a pickled model or TorchScript runs code from it; "
            "pass --trust if you trust its source, or give package.module:factory"
        )
    try:
        loaded = torch.jit.load(str(path)) if _is_torchscript(path) else torch.load(path, weights_only=False)  # type: ignore[no-untyped-call]
    except Exception as err:
        raise UsageError(f"TARGET {str(path)!r} could not be loaded as a model: {err}") from err
    if not isinstance(loaded, nn.Module):
        raise UsageError(f"TARGET {str(path)!r} must hold a whole torch.nn.Module, got {type(loaded).__name__}")
    return loaded


def _is_torchscript(path: Path) -> bool:
    import zipfile

    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith("/constants.pkl") or name == "constants.pkl" for name in archive.namelist())
