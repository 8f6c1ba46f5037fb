"""Split nested state (dicts and lists holding tensors) into named tensors plus a JSON document, and back.

`save_bundle` stores tensors and a JSON document separately; reducers, monitors and pools keep their state as
nested dicts, so these two functions turn one into the other. A tensor is replaced in the document by
`{"__tensor__": key}`, its key being the slash-joined path to it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .._io import load_bundle, save_bundle

__all__ = ["join_state", "load_state", "save_state", "split_state"]

_TENSOR = "__tensor__"


def split_state(state: Any, prefix: str = "") -> tuple[dict[str, torch.Tensor], Any]:
    """Return `(tensors, document)`: every tensor in `state` by key, and `state` with tensors replaced by keys."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(value: Any, key: str) -> Any:
        if isinstance(value, torch.Tensor):
            tensors[key] = value
            return {_TENSOR: key}
        if isinstance(value, dict):
            return {str(name): walk(item, f"{key}/{name}") for name, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(item, f"{key}/{index}") for index, item in enumerate(value)]
        return value

    return tensors, walk(state, prefix)


def join_state(tensors: dict[str, torch.Tensor], document: Any) -> Any:
    """Rebuild the state `split_state` split: the inverse of `split_state`.

    Raises:
        ValueError: the document names a tensor that `tensors` does not hold.
    """
    if isinstance(document, dict):
        if set(document) == {_TENSOR}:
            key = document[_TENSOR]
            if key not in tensors:
                raise ValueError(f"saved state must hold the tensor {key!r} its document names; the file is damaged")
            return tensors[key]
        return {name: join_state(tensors, item) for name, item in document.items()}
    if isinstance(document, list):
        return [join_state(tensors, item) for item in document]
    return document


def save_state(path: str | os.PathLike[str], state: dict[str, Any], kind: str) -> Path:
    """Write `state` atomically to `path` as safetensors + JSON, tagged with `kind`."""
    tensors, document = split_state(state)
    return save_bundle(path, tensors, {"state": document}, kind=kind)


def load_state(path: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    """Read back what `save_state` wrote with the same `kind`."""
    tensors, document = load_bundle(path, kind=kind)
    state = join_state(tensors, document.get("state"))
    if not isinstance(state, dict):
        raise ValueError(f"path {str(path)!r} must hold a hookscope {kind} state, found {type(state).__name__}")
    return state
