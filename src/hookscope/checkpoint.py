"""Checkpoints of hookscope state: any `state_dict()` to one safetensors + JSON file, and back.

`save_state(path, watch)` writes what `watch.state_dict()` returns (or a state dict given directly): tensors go
to the safetensors part, everything else (numbers, strings, None, lists, tuples, dicts) to its JSON header, with
the schema version, atomically. `load_state(path, watch)` reads it back (never unpickles) and, given an object,
calls its `load_state_dict`. Works for `Watch`, `ActivationStats`, `HookCallback`, monitors, monitor pools,
reducers and anything else whose state is made of those pieces.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ._check import checked
from ._io import load_bundle, save_bundle
from ._schema import SchemaError, found

__all__ = ["from_file"]  # save_state, load_state: their home is the top level (`from hookscope import save_state`)

_KIND = "state"


@checked()
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


@checked()
def load_state(path: str | os.PathLike[str], target: Any = None, *, kind: str | None = None) -> Any:
    """Read a state written by `save_state` with the same `kind`; with `target`, call `target.load_state_dict`.

    `kind` defaults to the kind of file `target`'s own `save` writes (its `state_kind`: "reducer" for reducers,
    "monitor", "monitor_pool"), else "state": `hookscope.load_state(path, reducer)` reads `reducer.save(path)`.

    The whole file is decoded and checked before `target` sees it; a target whose `load_state_dict` refuses
    the state is left as it was (hookscope's own objects load all or nothing).

    Raises:
        ValueError: the file is not a hookscope state file of this kind (see `hookscope._io.load_bundle`), is
            malformed, or holds a state `target` refuses; the message names the file and the field.
    """
    source = f"file {str(path)!r}"
    if kind is None:
        kind = getattr(target, "state_kind", _KIND) if target is not None else _KIND
    tensors, document = load_bundle(path, kind)
    if set(document) != {"state"}:
        raise SchemaError(source, "document", f"must hold exactly the key 'state', got keys {sorted(document)}")
    used: set[str] = set()
    state = _decode(document["state"], tensors, "state", source, used)
    unused = sorted(set(tensors) - used)
    if unused:
        raise SchemaError(source, f"tensor {unused[0]!r}", "is referenced nowhere in the state (a foreign tensor)")
    if target is not None:
        with from_file(path):
            target.load_state_dict(state)
    return state


@contextlib.contextmanager
def from_file(path: str | os.PathLike[str]) -> Iterator[None]:
    """Say in the errors raised inside that the state came from the file `path`.

    Raises:
        ValueError: re-raised with the file named first.
    """
    try:
        yield
    except SchemaError as err:
        raise err.from_source(f"file {str(path)!r}") from None
    except ValueError as err:
        raise ValueError(f"file {str(path)!r}: {err}") from None


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


_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _decode(value: Any, tensors: dict[str, torch.Tensor], at: str, source: str, used: set[str]) -> Any:
    """Undo `_encode`, refusing anything `_encode` cannot have written (the field is named)."""
    if isinstance(value, list):
        return [_decode(item, tensors, f"{at}[{i}]", source, used) for i, item in enumerate(value)]
    if not isinstance(value, dict):
        return value
    if len(value) != 1 or next(iter(value)) not in ("__tensor__", "__float__", "__tuple__", "__dict__"):
        raise SchemaError(
            source, at, f"must be encoded as one of __tensor__, __float__, __tuple__, __dict__, got {found(value)}"
        )
    ((tag, content),) = value.items()
    if tag == "__tensor__":
        if not isinstance(content, str) or content not in tensors or content in used:
            raise SchemaError(source, at, f"must name a tensor of the file (each once), got {content!r}")
        used.add(content)
        return tensors[content]
    if tag == "__float__":
        if content not in _FLOATS:
            raise SchemaError(source, at, f"must be 'nan', 'inf' or '-inf', got {found(content)}")
        return _FLOATS[content]
    if not isinstance(content, list):
        raise SchemaError(source, at, f"must hold a list under {tag}, got {found(content)}")
    if tag == "__tuple__":
        return tuple(_decode(item, tensors, f"{at}[{i}]", source, used) for i, item in enumerate(content))
    return _decode_dict(content, tensors, at, source, used)


def _decode_dict(pairs: list[Any], tensors: dict[str, torch.Tensor], at: str, source: str, used: set[str]) -> Any:
    out: dict[Any, Any] = {}
    for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2:
            raise SchemaError(source, at, f"must hold [key, value] pairs, got {found(pair)}")
        key = _decode(pair[0], tensors, f"{at} key", source, used)
        if not isinstance(key, (str, int, float, bool, type(None))) or key in out:
            raise SchemaError(source, f"{at} key {key!r}", "must be a str or number, once")
        out[key] = _decode(pair[1], tensors, f"{at}[{key!r}]", source, used)
    return out
