"""One selector language for modules, and dotted paths that are the same across wrappers.

A selector is one of:
    * `None`: every module that has parameters of its own;
    * a path or glob on dotted module paths (`"encoder.*.mlp"`; `*` matches one path component, `**` any number,
      `?` one character); the root is `""`, selected only by `""` itself;
    * an `nn.Module` inside the model, a module type, or a tuple of types;
    * a predicate `(path, module) -> bool`;
    * a list or tuple of any of the above (their union).

Paths are normalized across wrappers: DDP's and DataParallel's `module.`, torch.compile's `_orig_mod.`, FSDP1's
`_fsdp_wrapped_module.` and activation checkpointing's `_checkpoint_wrapped_module.` do not appear in them, so
one selector works on the model and on its wrapped forms.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any, TypeAlias

import torch.nn as nn

from .._check import aliases, checked, shown
from .._errors import unknown_name
from .._torch import WRAPPER_SEGMENTS, wrapped_module

__all__ = [
    "Selector",
    "has_own_params",
    "named_modules",
    "normalize_path",
    "path_of",
    "select_modules",
    "unwrap",
]

Predicate: TypeAlias = Callable[[str, nn.Module], bool]
Selector: TypeAlias = Any  # None | str | nn.Module | type | tuple[type, ...] | Predicate | list of these


@checked()
def unwrap(module: nn.Module) -> nn.Module:
    """Return the module inside DDP, DataParallel, torch.compile, FSDP1 and checkpoint wrappers."""
    return _unwrapped(module)


def _unwrapped(module: nn.Module) -> nn.Module:
    # unwrap() without the argument check, for the loop over every module in named_modules
    while True:
        inner = wrapped_module(module)
        if inner is None:
            return module
        module = inner


@checked()
def normalize_path(path: str) -> str:
    """Drop wrapper segments from a dotted path or parameter name.

    Example:
        >>> normalize_path("module._orig_mod.encoder.0.weight")
        'encoder.0.weight'
    """
    parts = path.split(".")
    while parts and parts[0] == "module":
        parts = parts[1:]
    return ".".join(p for p in parts if p not in WRAPPER_SEGMENTS)


@checked()
def named_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every module of `model` once, with its normalized dotted path, in registration order (root first)."""
    found: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", model)]
    # An explicit stack, not a recursive closure: a closure that calls itself is a reference cycle that would
    # keep `found`, and so the model, alive until the garbage collector runs (never, under gc.disable()).
    while stack:
        prefix, module = stack.pop()
        module = _unwrapped(module)
        if id(module) in seen:
            continue
        seen.add(id(module))
        found.append((prefix, module))
        children = [(f"{prefix}.{name}" if prefix else name, c) for name, c in module.named_children()]
        stack.extend(reversed(children))
    return found


@checked()
def has_own_params(module: nn.Module) -> bool:
    """Whether `module` has at least one parameter of its own (not counting its children's)."""
    return _has_own(module)


def _has_own(module: nn.Module) -> bool:
    # has_own_params() without the argument check, for the loop over every module of a model
    return next(iter(module.parameters(recurse=False)), None) is not None


@aliases(selector="select")
@checked()
def select_modules(model: nn.Module, select: Selector = None) -> list[tuple[str, nn.Module]]:
    """Return the `(path, module)` pairs of `model` that `select` picks, in model order.

    Raises:
        ValueError: the selector matches no module (the message lists the closest paths, or what the model has).
        TypeError: the selector is of no supported kind.
    """
    return choose_modules(model, select, "select")


def choose_modules(model: nn.Module, selector: Selector, argument: str) -> list[tuple[str, nn.Module]]:
    """`select_modules` for an entry point whose selector argument is called `argument` (in its errors).

    A predicate may choose nothing (a rank that watches no layer still joins the collectives); every other
    selector must choose something.

    Raises:
        ValueError: a selector that is not `None` or a predicate matches no module; the modules are listed.
        TypeError: the selector is of no supported kind.
    """
    modules = named_modules(model)
    chosen = _chosen_ids(modules, selector, argument)
    if not chosen and selector is not None and not _has_predicate(selector):
        listing = ", ".join(f"{path!r} ({type(m).__name__})" for path, m in modules[1:13] or modules)
        more = f" and {len(modules) - 13} more" if len(modules) > 13 else ""
        raise ValueError(
            f"{argument} must match at least one module of the {type(model).__name__}, got {shown(selector)}, which "
            f"matches none; the model has {listing}{more}"
        )
    return [(path, module) for path, module in modules if id(module) in chosen]


def _chosen_ids(modules: list[tuple[str, nn.Module]], selector: Selector, argument: str) -> set[int]:
    if selector is None:
        return {id(m) for _, m in modules if _has_own(m)}
    if isinstance(selector, str):
        return _match_path(modules, selector, argument)
    if isinstance(selector, nn.Module):
        if all(m is not selector for _, m in modules):
            raise ValueError(
                f"{argument} must be a module inside the model, got a {type(selector).__name__} that is not"
            )
        return {id(selector)}
    if isinstance(selector, type) or _is_type_tuple(selector):
        return {id(m) for _, m in modules if isinstance(m, selector)}
    if isinstance(selector, (list, tuple, set, frozenset)):
        chosen: set[int] = set()
        for item in selector:
            chosen |= _chosen_ids(modules, item, argument)
        return chosen
    if callable(selector):
        return {id(m) for path, m in modules if selector(path, m)}
    raise TypeError(
        f"{argument} must be None, a path or glob, a module, a module type, a predicate (path, module) -> bool,"
        f" or a list of these, got {shown(selector)}"
    )


def _has_predicate(selector: Selector) -> bool:
    if isinstance(selector, (list, tuple, set, frozenset)):
        return any(_has_predicate(item) for item in selector)
    return callable(selector) and not isinstance(selector, (type, nn.Module))


def _is_type_tuple(selector: Any) -> bool:
    return isinstance(selector, tuple) and bool(selector) and all(isinstance(t, type) for t in selector)


def _match_path(modules: list[tuple[str, nn.Module]], pattern: str, argument: str) -> set[int]:
    regex = _glob_regex(pattern)
    # The root's path is "": only the pattern "" selects it, never a glob such as "*".
    chosen = {id(m) for path, m in modules if (path or not pattern) and regex.fullmatch(path)}
    if not chosen:
        raise ValueError(unknown_name(argument, pattern, (p for p, _ in modules)))
    return chosen


@lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    out = []
    index = 0
    while index < len(pattern):
        if pattern.startswith("**.", index):
            out.append(r"(?:.*\.)?")
            index += 3
        elif pattern.startswith(".**", index) and index + 3 == len(pattern):
            out.append(r"(?:\..*)?")
            index += 3
        elif pattern.startswith("**", index):
            out.append(".*")
            index += 2
        elif pattern[index] == "*":
            out.append(r"[^.]*")
            index += 1
        elif pattern[index] == "?":
            out.append(r"[^.]")
            index += 1
        else:
            out.append(re.escape(pattern[index]))
            index += 1
    return re.compile("".join(out))


@checked()
def path_of(model: nn.Module, module: nn.Module) -> str | None:
    """The normalized path of `module` inside `model`, or `None` when it is not there."""
    return next((path for path, m in named_modules(model) if m is module), None)
