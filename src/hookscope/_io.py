"""Saved data: one safetensors file holding the tensors plus a JSON document, written atomically.

Nothing here ever unpickles. The JSON document rides in the safetensors header metadata under the key
`"hookscope"` together with a schema version; the header size is checked before it is read, so a truncated file
or a huge header fails with a clean `ValueError` and bounded memory.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

__all__ = ["SCHEMA_VERSION", "atomic_write", "load_bundle", "save_bundle"]

SCHEMA_VERSION = 1
MAX_HEADER_BYTES = 64 * 1024 * 1024
_META_KEY = "hookscope"


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write `data` to `path` through a temporary file in the same folder, fsync'd, then renamed over it.

    A crash during the write leaves the previous file as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes 0600 files: give the usual permissions
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def save_bundle(
    path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor], document: Mapping[str, Any], kind: str
) -> Path:
    """Save `tensors` and the JSON-able `document` (tagged with `kind`) atomically to one safetensors file.

    Tensors are made contiguous and moved to the CPU; the document must be plain JSON (no NaN checks are made:
    JSON's `NaN`/`Infinity` extensions are allowed).
    """
    header = {"kind": kind, "schema_version": SCHEMA_VERSION, "document": document}
    metadata = {_META_KEY: json.dumps(header)}
    cpu = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    return atomic_write(path, st_save(cpu, metadata=metadata))


def load_bundle(path: str | os.PathLike[str], kind: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Load a file written by `save_bundle` with the same `kind`: `(tensors, document)`.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: the file is not a hookscope safetensors file of this kind or schema (a pickle, a truncated
            file, a huge header, another kind), with what was found.
    """
    source = Path(path)
    data = source.read_bytes() if _header_ok(source) else b""
    try:
        tensors = st_load(data)
        header = json.loads(_metadata(data).get(_META_KEY, "null"))
    except Exception as err:
        raise ValueError(f"path {str(source)!r} is not a readable hookscope safetensors file: {err}") from None
    if not isinstance(header, dict) or header.get("kind") != kind:
        found = header.get("kind") if isinstance(header, dict) else None
        raise ValueError(f"path {str(source)!r} must hold hookscope data of kind {kind!r}, found {found!r}")
    if header.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"path {str(source)!r} has schema version {header.get('schema_version')!r}; this hookscope reads "
            f"version {SCHEMA_VERSION}"
        )
    return tensors, header["document"]


def _header_ok(source: Path) -> bool:
    size = source.stat().st_size
    with source.open("rb") as handle:
        prefix = handle.read(8)
    if len(prefix) < 8:
        raise ValueError(f"path {str(source)!r} is truncated: {size} bytes, not a safetensors file")
    (header_bytes,) = struct.unpack("<Q", prefix)
    if header_bytes > MAX_HEADER_BYTES or header_bytes + 8 > size:
        raise ValueError(
            f"path {str(source)!r} declares a {header_bytes}-byte header in a {size}-byte file: truncated, corrupt "
            "or not a safetensors file (pickled files are never loaded)"
        )
    return True


def _metadata(data: bytes) -> dict[str, str]:
    (header_bytes,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_bytes])
    metadata = header.get("__metadata__", {})
    return metadata if isinstance(metadata, dict) else {}
