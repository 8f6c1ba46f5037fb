"""Saved intervention specs: `{site: intervention or [interventions]}` as safetensors + JSON, nothing unpickled.

The tensors an intervention carries are stored as tensors (`"<site>/<index>/<field>"`); every other field goes in
the JSON document, with the intervention's type name. `load` checks the whole file before building anything.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from .._check import checked, shown
from .._io import load_bundle, save_bundle
from .._schema import Json, ListOf, MapOf, Record, SchemaError, Str, check
from ._intervene import Spec, as_items
from ._interventions import INTERVENTIONS, Intervention

__all__ = ["KIND", "load", "save"]

KIND = "steer-spec"
_ENTRY = Record(type=Str(choices=sorted(INTERVENTIONS)), fields=MapOf(Json()), tensors=MapOf(Str()))
_DOCUMENT = Record(spec=MapOf(ListOf(_ENTRY)))


@checked()
def save(path: str | os.PathLike[str], spec: Spec) -> Path:
    """Save `spec` (`{site: intervention or [interventions]}`) to `path` (safetensors + JSON, written atomically).

    Raises:
        TypeError: `spec` is not a mapping of str to interventions.
    """
    tensors: dict[str, torch.Tensor] = {}
    document: dict[str, list[dict[str, object]]] = {}
    if not isinstance(spec, dict) or not spec:
        raise TypeError(f"spec must be a non-empty dict {{site: intervention or [interventions]}}, got {shown(spec)}")
    for site, value in spec.items():
        if not isinstance(site, str):
            raise TypeError(f"spec keys must be site paths (str), got {site!r}")
        entries = []
        for index, item in enumerate(as_items(site, value)):
            entries.append(_entry(item, f"{site}/{index}", tensors))
        document[site] = entries
    return save_bundle(path, tensors, {"spec": document}, KIND)


def _entry(item: Intervention, prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, object]:
    fields: dict[str, object] = {}
    names: dict[str, str] = {}
    for field in dataclasses.fields(item):
        value = getattr(item, field.name)
        if isinstance(value, torch.Tensor):
            names[field.name] = f"{prefix}/{field.name}"
            tensors[names[field.name]] = value
        elif isinstance(value, slice):
            fields[field.name] = {"slice": [value.start, value.stop, value.step]}
        else:
            fields[field.name] = list(value) if isinstance(value, tuple) else value
    return {"type": type(item).__name__, "fields": fields, "tensors": names}


@checked()
def load(path: str | os.PathLike[str]) -> dict[str, list[Intervention]]:
    """Load a spec saved by `save`: `{site: [interventions]}`, all checked before any is returned.

    Raises:
        ValueError: the file is not a steer spec (a pickle, another kind, truncated), or a field does not fit
            (the message names the file and the field).
    """
    tensors, document = load_bundle(path, KIND)
    source = f"file {str(path)!r}"
    check(_DOCUMENT, document, source, at="document")
    out: dict[str, list[Intervention]] = {}
    for site, entries in document["spec"].items():
        out[site] = [
            _build(entry, tensors, f"{source}: document.spec[{site!r}][{i}]") for i, entry in enumerate(entries)
        ]
    return out


def _build(entry: dict[str, object], tensors: dict[str, torch.Tensor], where: str) -> Intervention:
    cls = INTERVENTIONS[str(entry["type"])]
    known = {field.name for field in dataclasses.fields(cls)}
    arguments: dict[str, object] = {}
    fields = dict(entry["fields"])  # type: ignore[call-overload]  # the schema checked it is a dict
    names = dict(entry["tensors"])  # type: ignore[call-overload]
    for name in [*fields, *names]:
        if name not in known:
            raise SchemaError(
                where, "fields", f"has an unknown field {name!r} for {cls.__name__}; known: {sorted(known)}"
            )
    for name, key in names.items():
        if key not in tensors:
            raise SchemaError(where, f"tensors.{name}", f"must name a tensor of the file, got {key!r}")
        arguments[name] = tensors[key]
    for name, value in fields.items():
        if isinstance(value, dict) and set(value) == {"slice"} and isinstance(value["slice"], list):
            value = slice(*value["slice"])
        arguments[name] = value
    try:
        return cls(**arguments)  # type: ignore[arg-type]
    except (TypeError, ValueError) as err:
        raise SchemaError(where, "fields", f"does not build a {cls.__name__}: {err}") from None
