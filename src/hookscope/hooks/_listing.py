"""What hooks are attached where (hookscope's and anyone else's), and removal by owner, tag, kind or path."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from .._check import checked, one_of
from .._torch import global_hooks, module_hooks, tensor_hooks
from ._registry import KINDS, REGISTRY, HookHandle
from ._select import _glob_regex, named_modules

__all__ = ["HookInfo", "list_hooks", "remove_hooks"]


@dataclass(frozen=True)
class HookInfo:
    """One hook on a model: where, what kind, and whether hookscope placed it (and for whom)."""

    path: str
    kind: str
    is_hookscope: bool
    owner: str = ""
    tags: tuple[str, ...] = ()
    id: int | None = None


@checked()
def list_hooks(model: nn.Module | None = None) -> list[HookInfo]:
    """List the hooks on `model`'s modules and parameters, and global hooks (path `"<global>"`).

    Hooks that hookscope did not place are listed too, with `is_hookscope=False`. With `model=None`, list every
    hook hookscope placed in the process.
    """
    handles = REGISTRY.handles()
    if model is None:
        return [_info(h, h.path or "") for h in handles]
    ours = {torch_id for h in handles for torch_id in h.torch_ids}
    by_target: dict[int, list[HookHandle]] = {}
    for handle in handles:
        target = handle.target
        if target is not None:
            by_target.setdefault(id(target), []).append(handle)
    rows: list[HookInfo] = []
    for path, module in named_modules(model):
        rows += [_info(h, path) for h in by_target.get(id(module), [])]
        rows += _foreign(module_hooks(module), path, ours)
        for name, parameter in module.named_parameters(recurse=False):
            param_path = f"{path}.{name}" if path else name
            rows += [_info(h, param_path) for h in by_target.get(id(parameter), [])]
            rows += _foreign(tensor_hooks(parameter), param_path, ours)
    rows += [_info(h, "<global>") for h in handles if h.kind.startswith("global_")]
    rows += _foreign(global_hooks(), "<global>", ours)
    return rows


@checked(kind=one_of(KINDS))
def remove_hooks(
    *,
    owner: object | None = None,
    tag: str | None = None,
    kind: str | None = None,
    path: str | None = None,
    model: nn.Module | None = None,
) -> int:
    """Remove the hookscope hooks that match every criterion given; return how many were removed.

    `path` is a glob on module paths; it is matched against paths inside `model` when given, otherwise against
    the path recorded at registration. With `model` alone, every hookscope hook on that model goes. User hooks
    are never touched.

    Raises:
        ValueError: no criterion was given.
    """
    if owner is None and tag is None and kind is None and path is None and model is None:
        raise ValueError("remove_hooks needs at least one of owner, tag, kind, path or model; got none")
    paths: dict[int, str] | None = None
    if model is not None:
        paths = {}
        for p, m in named_modules(model):
            paths[id(m)] = p
            for name, parameter in m.named_parameters(recurse=False):
                paths[id(parameter)] = f"{p}.{name}" if p else name
    regex = _glob_regex(path) if path is not None else None
    removed = 0
    for handle in REGISTRY.handles():
        if owner is not None and handle.owner is not owner:
            continue
        if (tag is not None and tag not in handle.tags) or (kind is not None and handle.kind != kind):
            continue
        where = handle.path
        if paths is not None:
            target = handle.target
            where = paths.get(id(target)) if target is not None else None
            if where is None:
                continue
        if regex is not None and (where is None or not regex.fullmatch(where)):
            continue
        handle.remove()
        removed += 1
    return removed


def _info(handle: HookHandle, path: str) -> HookInfo:
    owner = handle.owner
    owner_name = owner if isinstance(owner, str) else ("" if owner is None else type(owner).__name__)
    return HookInfo(path, handle.kind, True, str(owner_name), tuple(sorted(handle.tags)), handle.id)


def _foreign(
    dicts: dict[str, Mapping[int, Callable[..., Any]]], path: str, ours: set[tuple[int, int]]
) -> list[HookInfo]:
    """The hooks of `dicts` (torch's, by kind: `hookscope._torch`) that hookscope did not place."""
    return [
        HookInfo(path, kind, False) for kind, hooks in dicts.items() for key in hooks if (id(hooks), key) not in ours
    ]
