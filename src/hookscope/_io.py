"""Saved data: one safetensors file holding the tensors plus a JSON document, written atomically.

Nothing here ever unpickles. The JSON document rides in the safetensors header metadata under the key
`"hookscope"` together with a schema version; the header size is checked before it is read, so a truncated file
or a huge header fails with a clean `ValueError` and bounded memory.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ._schema import Int, Json, MapOf, Record, Str, check

__all__ = ["SCHEMA_VERSION", "atomic_write", "check_target", "load_bundle", "save_bundle"]

SCHEMA_VERSION = 1
MAX_HEADER_BYTES = 64 * 1024 * 1024
_META_KEY = "hookscope"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_HEADER = Record(
    kind=Str(),
    schema_version=Int(),
    document=MapOf(Json()),
    optional={"renamed": MapOf(Str())},
)


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write `data` to `path` through a temporary file in the same folder, fsync'd, then renamed over it.

    A crash during the write leaves the previous file as it was. Text is written as UTF-8, a lone surrogate
    (from a name that was never valid Unicode) as U+FFFD.

    Raises:
        ValueError: `path` exists and is not a regular file (a folder, a device such as /dev/null, a FIFO): the
            rename would replace it.
    """
    target = Path(path)
    check_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = _LONE_SURROGATE.sub("\ufffd", data).encode("utf-8") if isinstance(data, str) else data
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


def check_target(target: Path) -> None:
    """Refuse to save onto `target` when it exists and is not a regular file (or a link to one).

    Raises:
        ValueError: `target` is a folder, a device, a FIFO or a socket.
    """
    try:
        mode = os.stat(target).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
        raise ValueError(
            f"path must be a regular file to save to, got {str(target)!r}, which is {kind}; saving would replace "
            "it: choose a file name (e.g. run.safetensors)"
        )


def _check_source(source: Path) -> None:
    mode = os.stat(source).st_mode  # FileNotFoundError for a missing file, as open() would raise
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
        raise ValueError(f"path must be a hookscope safetensors file, got {str(source)!r}, which is {kind}")


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
    header: dict[str, Any] = {"kind": kind, "schema_version": SCHEMA_VERSION, "document": document}
    cpu: dict[str, torch.Tensor] = {}
    renamed: dict[str, str] = {}
    for name, tensor in tensors.items():
        key = name
        if _LONE_SURROGATE.search(name):  # not UTF-8: safetensors cannot store the name itself
            key = f"hookscope.renamed/{len(renamed)}"
            renamed[key] = name
        cpu[key] = tensor.detach().to("cpu").contiguous()
    cpu = _unshared(cpu)
    if renamed:
        header["renamed"] = renamed
    metadata = {_META_KEY: json.dumps(header)}
    return atomic_write(path, st_save(cpu, metadata=metadata))


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copy the tensors that share memory with an earlier one (views of one buffer): safetensors refuses them."""
    seen: set[int] = set()
    out = {}
    for key, tensor in tensors.items():
        storage = tensor.untyped_storage().data_ptr() if tensor.numel() else None
        out[key] = tensor.clone() if storage is not None and storage in seen else tensor
        if storage is not None:
            seen.add(storage)
    return out


def load_bundle(path: str | os.PathLike[str], kind: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Load a file written by `save_bundle` with the same `kind`: `(tensors, document)`.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: the file is not a hookscope safetensors file of this kind or schema (a pickle, a truncated
            file, a huge header, another kind, a folder, a device), with what was found.
    """
    source = Path(path)
    _check_source(source)
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
    check(_HEADER, header, f"file {str(source)!r}", at="header")
    for key, name in header.get("renamed", {}).items():
        if key not in tensors or name in tensors:
            raise ValueError(f"file {str(source)!r}: field header.renamed[{key!r}] must rename a tensor of the file")
        tensors[name] = tensors.pop(key)
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
