"""Sites: which modules, and which tensor of a module's call is "the value" that steer records and edits.

A site is a module path (normalized: the same on a model and on its DDP / compiled / FSDP wrappers) and a side:

* `at="output"`: the module's output, or its first tensor when the output is a tuple, list, dict or dataclass
  (HF blocks return `(hidden_states, ...)`);
* `at="input"`: the module's first input: the first positional argument, or, when it is called with keywords
  only, the first keyword argument that is a tensor (the residual stream entering a block; the heads entering
  an output projection).

Every steer hook is built here (`site_hook`) and placed through `hookscope.hooks.register_module_hook` with the
tag `steer`, so `list_hooks()` shows it and scopes remove it. Editing hooks are prepended: every other hook on the
same module, whenever it was placed (a user's, a `watch()`), sees the edited value.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.nn as nn

from ..hooks import HookHandle, register_module_hook
from ..hooks._calls import HookErrors
from ..hooks._guards import check_hookable, warn_if_compiled
from ..hooks._select import Selector, choose_modules

__all__ = [
    "AT",
    "TAG",
    "Edit",
    "batch_size_of",
    "first_tensor",
    "place",
    "place_all",
    "resolve",
    "run_model",
    "with_first_tensor",
]

AT = ("input", "output")
TAG = "steer"

Edit = Callable[[torch.Tensor], torch.Tensor | None]
"""`edit(value) -> None (observe only) or the new value`."""


def resolve(model: nn.Module, select: Selector, argument: str) -> list[tuple[str, nn.Module]]:
    """The `(path, module)` pairs `select` names, in model order; a wrong path lists the closest ones.

    A model compiled before gets a `CompiledModelWarning` (hooks added after its first compiled call run only
    once it recompiles).

    Raises:
        ValueError: the selector matches nothing (with the closest paths).
        TypeError: `model` is not an `nn.Module`, or is a TorchScript module (hooks never run there).
    """
    check_hookable(model, "model")
    warn_if_compiled(model, stacklevel=4)
    return choose_modules(model, select, argument)


def first_tensor(value: Any) -> torch.Tensor | None:
    """The first tensor of `value` (itself, or depth first inside tuples, lists, dicts and dataclasses)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        items: Iterable[Any] = value
    elif isinstance(value, Mapping):
        items = value.values()
    else:
        return None
    for item in items:
        found = first_tensor(item)
        if found is not None:
            return found
    return None


def with_first_tensor(value: Any, new: torch.Tensor) -> Any:
    """`value` rebuilt with its first tensor replaced by `new` (a new container; `value` is untouched)."""
    if isinstance(value, torch.Tensor):
        return new
    if isinstance(value, (tuple, list)):
        items = list(value)
        for index, item in enumerate(items):
            if first_tensor(item) is not None:
                items[index] = with_first_tensor(item, new)
                break
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, Mapping):
        key = next(k for k, item in value.items() if first_tensor(item) is not None)
        return _mapping_with(value, key, with_first_tensor(value[key], new))
    return value


def _mapping_with(value: Mapping[Any, Any], key: Any, item: Any) -> Any:
    # A shallow copy keeps the mapping's type (HF ModelOutput, defaultdict) and its other entries.
    new = copy.copy(value)
    new[key] = item  # type: ignore[index]
    return new


def _output_hook(edit: Edit) -> Callable[[nn.Module, Any, Any], Any]:
    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        value = first_tensor(output)
        if value is None:
            return None
        new = edit(value)
        return None if new is None else with_first_tensor(output, new)

    return hook


def _input_hook(edit: Edit) -> Callable[[nn.Module, Any, Any], Any]:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            value = first_tensor(args[0])
            new = None if value is None else edit(value)
            return None if new is None else ((with_first_tensor(args[0], new), *args[1:]), kwargs)
        key = next((k for k, item in kwargs.items() if isinstance(item, torch.Tensor)), None)
        if key is None:
            return None
        new = edit(kwargs[key])
        return None if new is None else (args, {**kwargs, key: new})

    return hook


def place(
    module: nn.Module, path: str, at: str, edit: Edit, *, owner: object, is_edit: bool, errors: HookErrors | None = None
) -> HookHandle:
    """Place `edit` on `module` at its input or output through the registry (tagged `steer`).

    `edit(value) -> None or new value` is called with the site's value on every call of the module. Edits are
    prepended (every other hook on the module sees the new value); observers are appended. A failure of an edit
    is raised with the site named; given `errors` (observers), it is counted there instead.
    """
    if at == "output":
        return register_module_hook(
            module, "forward", _output_hook(edit), owner=owner, path=path, tags=(TAG,), prepend=is_edit, errors=errors
        )
    return register_module_hook(
        module, "forward_pre", _input_hook(edit), owner=owner, path=path, tags=(TAG,), prepend=is_edit,
        with_kwargs=True, errors=errors,
    )  # fmt: skip


def place_all(
    sites: Iterable[tuple[str, nn.Module, Edit]],
    at: str,
    *,
    owner: object,
    is_edit: bool,
    errors: HookErrors | None = None,
) -> list[HookHandle]:
    """Place every edit, or none: if one registration fails, those already placed are removed."""
    handles: list[HookHandle] = []
    try:
        for path, module, edit in sites:
            handles.append(place(module, path, at, edit, owner=owner, is_edit=is_edit, errors=errors))
    except BaseException:
        for handle in reversed(handles):
            handle.remove()
        raise
    return handles


def run_model(model: nn.Module, inputs: Any) -> Any:
    """Call `model` with `inputs`: a tensor (`model(x)`), a tuple (`model(*args)`) or a mapping (`model(**kw)`)."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


def batch_size_of(inputs: Any, argument: str) -> int:
    """The batch size of model inputs: dim 0 of their first tensor.

    Raises:
        TypeError: `inputs` holds no tensor.
    """
    tensor = first_tensor(dict(inputs) if isinstance(inputs, Mapping) else inputs)
    if tensor is None or tensor.dim() == 0:
        raise TypeError(
            f"{argument} must be model inputs holding a batched tensor (a tensor, a tuple of arguments or a dict of "
            f"keyword arguments), got {type(inputs).__name__}"
        )
    return int(tensor.shape[0])
