"""Checkpoints of hookscope state: any `state_dict()` to one safetensors + JSON file, and back.

`save_state(path, watch)` writes what `watch.state_dict()` returns (or a state dict given directly): tensors go
to the safetensors part, everything else (numbers, strings, None, lists, tuples, dicts) to its JSON header, with
the schema version, atomically. `load_state(path, watch)` reads it back (never unpickles) and, given an object,
calls its `load_state_dict`. Works for `Watch`, `ActivationStats`, `HookCallback`, monitors, monitor pools,
reducers and anything else whose state is made of those pieces.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from ._io import load_bundle, save_bundle

__all__ = ["load_state", "save_state"]

_KIND = "state"


def save_state(path: str | os.PathLike[str], source: Any, *, kind: str = _KIND) -> Path:
    """Write `source.state_dict()` (or `source` itself, a state dict) atomically to `path`; return the path.

    `kind` tags the file (`load_state` with another kind refuses it), e.g. "monitor" or "reducer".

    Raises:
        TypeError: the state holds a value that is neither a tensor nor plain JSON data (the key path says where).
    """
    state = source.state_dict() if hasattr(source, "state_dict") else source
    tensors: dict[str, torch.Tensor] = {}
    document = _encode(state, "state", tensors)
    return save_bundle(path, tensors, {"state": document}, kind)


def load_state(path: str | os.PathLike[str], target: Any = None, *, kind: str = _KIND) -> Any:
    """Read a state written by `save_state` with the same `kind`; with `target`, call `target.load_state_dict`.

    Raises:
        ValueError: the file is not a hookscope state file of this kind (see `hookscope._io.load_bundle`).
    """
    tensors, document = load_bundle(path, kind)
    state = _decode(document["state"], tensors)
    if target is not None:
        target.load_state_dict(state)
    return state


def _encode(value: Any, where: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = value
        return {"__tensor__": key}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, (list, tuple)):
        items = [_encode(item, f"{where}[{i}]", tensors) for i, item in enumerate(value)]
        return items if isinstance(value, list) else {"__tuple__": items}
    if isinstance(value, dict):
        pairs = [
            [_encode(k, f"{where} key", tensors), _encode(v, f"{where}[{k!r}]", tensors)] for k, v in value.items()
        ]
        return {"__dict__": pairs}
    raise TypeError(
        f"{where} must hold tensors, numbers, strings, None, lists, tuples or dicts to be saved, got "
        f"{type(value).__name__}; convert it in state_dict()"
    )


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(item, tensors) for item in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        return tensors[value["__tensor__"]]
    if "__float__" in value:
        return float(value["__float__"])
    if "__tuple__" in value:
        return tuple(_decode(item, tensors) for item in value["__tuple__"])
    return {_decode(k, tensors): _decode(v, tensors) for k, v in value["__dict__"]}
