"""Save and load the nested state of reducers, monitors and pools (safetensors + JSON, via `hookscope.checkpoint`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import checkpoint

__all__ = ["load_state", "save_state"]


def save_state(path: str | os.PathLike[str], state: dict[str, Any], kind: str) -> Path:
    """Write `state` atomically to `path` as safetensors + JSON, tagged with `kind`."""
    return checkpoint.save_state(path, state, kind=kind)


def load_state(path: str | os.PathLike[str], kind: str) -> dict[str, Any]:
    """Read back what `save_state` wrote with the same `kind`.

    Raises:
        ValueError: the file is not a hookscope safetensors file of this kind, or holds no state dict.
    """
    state = checkpoint.load_state(path, kind=kind)
    if not isinstance(state, dict):
        raise ValueError(f"path {str(path)!r} must hold a hookscope {kind} state, found {type(state).__name__}")
    return state
