"""Every private PyTorch API hookscope relies on, in one place, each checked before it is trusted.

Where torch has a public API hookscope uses it; what only torch's internals give (the id of the running backward,
the autograd engine's end-of-backward callback, the scale of a `GradScaler` without a host sync, the hook dicts of
modules and tensors that `list_hooks` reads, the attribute a wrapper keeps its module in ...) is reached through
the functions below and nowhere else (tests/package/test_private_torch.py checks it). Each reliance is a `Reliance`:
what of torch it reads and what stops working without it. It is probed once, at its first use (not at import: most
runs never need most of them); a failed probe gives ONE `TorchInternalsWarning` naming the torch internal and what
stops working, and the function falls back to the documented degraded behaviour: never a silent gap, never an
exception in the user's training. Tested on torch 2.13, the lowest version pyproject.toml declares.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.modules.module as module_globals

from ._errors import TorchInternalsWarning

__all__ = [
    "GLOBAL_HOOK_KINDS",
    "MODULE_HOOK_KINDS",
    "RELIANCES",
    "TENSOR_HOOK_KINDS",
    "WRAPPER_SEGMENTS",
    "Reliance",
    "aten_ops",
    "children",
    "flatten",
    "foreach_copy_",
    "foreach_sub_",
    "forward_pre_hooks",
    "global_hooks",
    "graph_task_id",
    "handle_key",
    "is_available",
    "is_compile_wrapper",
    "is_compiled_in_place",
    "is_view",
    "module_hooks",
    "queue_after_backward",
    "scaler_scale",
    "scaler_states",
    "tensor_hooks",
    "wrapped_module",
]


@dataclass(frozen=True)
class Reliance:
    """One private torch API: what hookscope reads, what stops working without it, and how it is checked.

    Args:
        what: The torch internal, as a reader finds it in torch's source.
        stops: What hookscope can no longer do (or does worse) when the probe fails.
        probe: Returns whether the internal is there and behaves as hookscope expects; it must not raise.
    """

    what: str
    stops: str
    probe: Callable[[], bool]


def _has(owner: object, *names: str) -> bool:
    return all(hasattr(owner, name) for name in names)


def _probe_graph_task_id() -> bool:
    read = getattr(torch._C, "_current_graph_task_id", None)
    return callable(read) and isinstance(read(), int)  # -1 outside a backward, the running one's id inside


def _probe_execution_engine() -> bool:
    engine = getattr(torch.autograd.Variable, "_execution_engine", None)
    return callable(getattr(engine, "queue_callback", None))


def _probe_scaler() -> bool:
    """A tiny CPU GradScaler run: `_scale` is the scale tensor and `update()` replaces `_per_optimizer_states`
    (hookscope tells an update from no update by that dict's identity)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
        weight = torch.zeros(1, requires_grad=True)
        optimizer = torch.optim.SGD([weight], lr=0.0)
        scaler.scale(weight.sum()).backward()  # type: ignore[no-untyped-call]
        scale = getattr(scaler, "_scale", None)
        before = getattr(scaler, "_per_optimizer_states", None)
        scaler.step(optimizer)
        scaler.update()
        after = getattr(scaler, "_per_optimizer_states", None)
    except Exception:
        return False
    right_scale = isinstance(scale, torch.Tensor) and scale.numel() == 1 and float(scale) == 2.0
    return right_scale and isinstance(before, dict) and isinstance(after, dict) and after is not before


def _probe_module_hooks() -> bool:
    module = nn.Module()
    handles = [module.register_forward_pre_hook(_noop), module.register_forward_hook(_noop)]
    handles += [module.register_full_backward_pre_hook(_noop), module.register_full_backward_hook(_noop)]
    handles.append(module.register_forward_pre_hook(_noop, with_kwargs=True))
    try:
        dicts = [getattr(module, name, None) for _, name in _MODULE_DICTS]
        kwargs = getattr(module, "_forward_pre_hooks_with_kwargs", None)
        found = [isinstance(d, Mapping) and h.id in d for d, h in zip(dicts, handles, strict=False)]
        return all(found) and isinstance(kwargs, Mapping) and handles[-1].id in kwargs
    finally:
        for handle in handles:
            handle.remove()


def _probe_tensor_hooks() -> bool:
    leaf = torch.zeros(1, requires_grad=True)
    handles = [
        leaf.register_hook(_noop),  # type: ignore[no-untyped-call]
        leaf.register_post_accumulate_grad_hook(_noop),  # type: ignore[no-untyped-call]
    ]
    dicts = [getattr(leaf, name, None) for _, name in _TENSOR_DICTS]
    return all(isinstance(d, Mapping) and h.id in d for d, h in zip(dicts, handles, strict=True))


def _probe_global_hooks() -> bool:
    """Each global dict exists; a hook registered by torch's public function lands in it (all but the full
    backward hook: registering one changes which kind of global backward hook torch accepts)."""
    dicts = {kind: getattr(module_globals, name, None) for kind, name in _GLOBAL_DICTS}
    if not all(isinstance(d, Mapping) for d in dicts.values()):
        return False
    handles = {kind: register(_noop) for kind, register in _GLOBAL_REGISTER.items()}
    try:
        return all(handle.id in dicts[kind] for kind, handle in handles.items())  # type: ignore[operator]
    finally:
        for handle in handles.values():
            handle.remove()


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


_MODULE_DICTS = (
    ("forward_pre", "_forward_pre_hooks"),
    ("forward", "_forward_hooks"),
    ("backward_pre", "_backward_pre_hooks"),
    ("backward", "_backward_hooks"),
)
_TENSOR_DICTS = (("tensor", "_backward_hooks"), ("post_accumulate_grad", "_post_accumulate_grad_hooks"))
_GLOBAL_DICTS = (
    ("global_forward_pre", "_global_forward_pre_hooks"),
    ("global_forward", "_global_forward_hooks"),
    ("global_backward_pre", "_global_backward_pre_hooks"),
    ("global_backward", "_global_backward_hooks"),
    ("global_buffer_registration", "_global_buffer_registration_hooks"),
    ("global_module_registration", "_global_module_registration_hooks"),
    ("global_parameter_registration", "_global_parameter_registration_hooks"),
)
_GLOBAL_REGISTER = {
    "global_forward_pre": module_globals.register_module_forward_pre_hook,
    "global_forward": module_globals.register_module_forward_hook,
    "global_backward_pre": module_globals.register_module_full_backward_pre_hook,
    "global_buffer_registration": module_globals.register_module_buffer_registration_hook,
    "global_module_registration": module_globals.register_module_module_registration_hook,
    "global_parameter_registration": module_globals.register_module_parameter_registration_hook,
}
MODULE_HOOK_TABLES = tuple(name for _, name in _MODULE_DICTS)
"""The names of torch's per-module hook dicts (hook id -> hook) in a module's `__dict__` (its pickled state)."""
MODULE_HOOK_SIDE_TABLES = {
    "_forward_pre_hooks_with_kwargs": "_forward_pre_hooks",
    "_forward_hooks_with_kwargs": "_forward_hooks",
    "_forward_hooks_always_called": "_forward_hooks",
}
"""torch's per-module flags (hook id -> True) in a module's `__dict__`, each keyed by the ids of one hook dict."""
MODULE_HOOK_KINDS = tuple(kind for kind, _ in _MODULE_DICTS)
"""The kinds of hooks `module_hooks` reads on a module, in the order torch runs them."""
TENSOR_HOOK_KINDS = tuple(kind for kind, _ in _TENSOR_DICTS)
"""The kinds of hooks `tensor_hooks` reads on a tensor."""
GLOBAL_HOOK_KINDS = tuple(kind for kind, _ in _GLOBAL_DICTS)
"""The kinds of global module hooks `global_hooks` reads (every `torch.nn.modules.module.register_module_*`)."""

_WRAPPERS = {  # wrapper type name -> (the attribute holding the wrapped module, whether torch documents it)
    "DistributedDataParallel": ("module", True),
    "DataParallel": ("module", True),
    "FullyShardedDataParallel": ("module", True),  # a property: the `_fsdp_wrapped_module` child
    "OptimizedModule": ("_orig_mod", False),
    "CheckpointWrapper": ("_checkpoint_wrapped_module", False),
    "OffloadWrapper": ("_checkpoint_wrapped_module", False),
}
WRAPPER_SEGMENTS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
"""The path segments torch's wrappers add to their module's parameter and module names (torch.compile's, FSDP1's,
activation checkpointing's), which normalized paths leave out."""

RELIANCES: dict[str, Reliance] = {
    "graph_task_id": Reliance(
        "torch._C._current_graph_task_id()",
        "a forward run inside a backward (an activation-checkpoint recomputation) is no longer recognized: it is "
        "counted as a training forward, and the CLI cannot tell which loss a backward belongs to",
        _probe_graph_task_id,
    ),
    "execution_engine": Reliance(
        "torch.autograd.Variable._execution_engine.queue_callback",
        "callbacks' after_backward events no longer fire at the end of a backward",
        _probe_execution_engine,
    ),
    "grad_scaler": Reliance(
        "torch.amp.GradScaler._scale and ._per_optimizer_states (replaced by update())",
        "output-gradient norms under a GradScaler stay multiplied by the loss scale, and steps the scaler skips "
        "are counted as steps (meta['grad_scaler'] says so)",
        _probe_scaler,
    ),
    "is_view": Reliance(
        "torch.Tensor._is_view()",
        "every gradient is copied before it is described (slower; the statistics are unchanged)",
        lambda: _has(torch.Tensor, "_is_view") and torch.zeros(2)[:1]._is_view() and not torch.zeros(2)._is_view(),
    ),
    "flatten": Reliance(
        "torch._C._nn.flatten_dense_tensors",
        "small parameters and gradients are concatenated from Python, one reshape each (slower; values unchanged)",
        lambda: torch._C._nn.flatten_dense_tensors([torch.zeros(2, 1), torch.ones(1)]).tolist() == [0.0, 0.0, 1.0],
    ),
    "foreach": Reliance(
        "torch._foreach_copy_ and torch._foreach_sub_",
        "parameter snapshots for update ratios are copied one tensor at a time (slower; values unchanged)",
        lambda: _has(torch, "_foreach_copy_", "_foreach_sub_"),
    ),
    "module_hooks": Reliance(
        "nn.Module._forward_pre_hooks, _forward_hooks, _backward_pre_hooks, _backward_hooks, "
        "_forward_pre_hooks_with_kwargs",
        "list_hooks no longer lists hooks that hookscope did not place on modules, the summary's hook column misses "
        "them, and the CLI cannot replay a module's pre-hooks on the forward it starts watching in",
        _probe_module_hooks,
    ),
    "tensor_hooks": Reliance(
        "torch.Tensor._backward_hooks and _post_accumulate_grad_hooks",
        "list_hooks no longer lists hooks that hookscope did not place on parameters",
        _probe_tensor_hooks,
    ),
    "global_hooks": Reliance(
        "torch.nn.modules.module._global_*_hooks",
        "list_hooks no longer lists global module hooks that hookscope did not place",
        _probe_global_hooks,
    ),
    "modules_dict": Reliance(
        "nn.Module._modules",
        "a child registered under two names is shown once (the summary's repeated-module rows are missing)",
        lambda: isinstance(getattr(nn.Sequential(nn.Identity()), "_modules", None), Mapping),
    ),
    "compiled_call_impl": Reliance(
        "nn.Module._compiled_call_impl (set by module.compile())",
        "a module compiled in place with module.compile() is not recognized: hookscope does not warn that hooks "
        "attached after compiling may be ignored",
        lambda: _has(nn.Module(), "_compiled_call_impl") and nn.Module()._compiled_call_impl is None,
    ),
    "wrappers": Reliance(
        "the attribute a torch wrapper keeps its module in (OptimizedModule._orig_mod, "
        "CheckpointWrapper._checkpoint_wrapped_module)",
        "a wrapped model is not unwrapped: paths keep the wrapper's segments and selectors see the wrapper only",
        lambda: True,  # checked on each wrapper met (`wrapped_module`): there is no wrapper to probe at first use
    ),
}
"""Every private torch API hookscope relies on, by the key its functions check."""

_LOCK = threading.Lock()
_CHECKED: dict[str, bool] = {}


def is_available(key: str) -> bool:
    """Whether the private torch API `key` (of `RELIANCES`) is there; the first failed check warns once.

    Raises:
        KeyError: `key` is not one of `RELIANCES`.
    """
    found = _CHECKED.get(key)
    if found is None:
        reliance = RELIANCES[key]
        with _LOCK:
            found = _CHECKED.get(key)
            if found is None:
                try:
                    found = bool(reliance.probe())
                except Exception:
                    found = False
                _CHECKED[key] = found
                if not found:
                    _warn(reliance.what, reliance.stops)
    return found


def _warn(what: str, stops: str) -> None:
    warnings.warn(
        f"torch {torch.__version__} changed {what}, a private PyTorch API hookscope relies on (tested on torch "
        f"2.13): {stops}. Please report it to hookscope with your torch version.",
        TorchInternalsWarning,
        stacklevel=4,
    )


def forget_checks() -> None:
    """Forget every check made (they run again, and warn again, at the next use); for tests."""
    with _LOCK:
        _CHECKED.clear()
        _WRAPPERS_WARNED.clear()


# ---- autograd ---------------------------------------------------------------------------------------------------


def graph_task_id() -> int:
    """The id of the backward this thread runs in now, -1 outside a backward (or when torch no longer says)."""
    if _CHECKED.get("graph_task_id") or is_available("graph_task_id"):  # the first test inlined: every forward
        return torch._C._current_graph_task_id()
    return -1


def queue_after_backward(callback: Callable[[], None]) -> bool:
    """Run `callback` once the backward running now has finished (from inside a hook of that backward).

    Returns:
        Whether it was queued (`False`, after one warning, when torch no longer offers it).
    """
    if not is_available("execution_engine"):
        return False
    torch.autograd.Variable._execution_engine.queue_callback(callback)
    return True


def is_view(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a view of another tensor's storage (`True` when torch no longer says: copy to be safe)."""
    if _CHECKED.get("is_view") or is_available("is_view"):  # the first test inlined: every gradient
        return tensor._is_view()
    return True


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The values of `tensors` concatenated into one flat tensor (dtypes promoted as by `torch.cat`), in one call
    where torch can: a new tensor, except for one contiguous tensor alone (then a view of it may be returned)."""
    if _CHECKED.get("flatten") or is_available("flatten"):  # the first test inlined: every measured step
        return torch._C._nn.flatten_dense_tensors(tensors)
    return torch.cat([tensor.reshape(-1) for tensor in tensors])


def foreach_copy_(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """Copy each of `sources` into the matching destination, in one kernel launch per device where torch can."""
    if is_available("foreach"):
        torch._foreach_copy_(destinations, sources)
        return
    for destination, source in zip(destinations, sources, strict=True):
        destination.copy_(source)


def foreach_sub_(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """Subtract each of `sources` from the matching destination in place, batched where torch can."""
    if is_available("foreach"):
        torch._foreach_sub_(destinations, sources)
        return
    for destination, source in zip(destinations, sources, strict=True):
        destination.sub_(source)


# ---- GradScaler -------------------------------------------------------------------------------------------------


def scaler_scale(scaler: torch.amp.GradScaler) -> torch.Tensor | None:
    """The scaler's current scale as its 0-d device tensor (no host sync), `None` before its first `scale()` call
    or when torch no longer keeps it there (`GradScaler.get_scale()` would sync)."""
    if not is_available("grad_scaler"):
        return None
    scale = getattr(scaler, "_scale", None)
    return scale if isinstance(scale, torch.Tensor) else None


def scaler_states(scaler: torch.amp.GradScaler | None) -> object | None:
    """The scaler's per-optimizer state, which `update()` replaces by a new object: compare identities to learn
    whether `update()` ran. `None` when torch no longer behaves so (after one warning)."""
    if scaler is None or not is_available("grad_scaler"):
        return None
    return getattr(scaler, "_per_optimizer_states", None)


# ---- hook dicts (list_hooks, the summary, the CLI) --------------------------------------------------------------


def module_hooks(module: nn.Module) -> dict[str, Mapping[int, Callable[..., Any]]]:
    """The hooks registered on `module` by anyone, by kind (`MODULE_HOOK_KINDS`), keyed by their handles' ids;
    empty (after one warning) when torch no longer keeps them where hookscope reads them."""
    if not is_available("module_hooks"):
        return {}
    return {kind: getattr(module, name) for kind, name in _MODULE_DICTS}


def forward_pre_hooks(module: nn.Module) -> list[tuple[int, Callable[..., Any], bool]]:
    """`module`'s forward pre-hooks in the order they run: (handle id, hook, whether it takes kwargs)."""
    if not is_available("module_hooks"):
        return []
    with_kwargs = module._forward_pre_hooks_with_kwargs
    return [(key, hook, key in with_kwargs) for key, hook in module._forward_pre_hooks.items()]


def tensor_hooks(tensor: torch.Tensor) -> dict[str, Mapping[int, Callable[..., Any]]]:
    """The hooks registered on `tensor` by anyone, by kind (`TENSOR_HOOK_KINDS`); kinds without hooks are empty."""
    if not is_available("tensor_hooks"):
        return {}
    return {kind: getattr(tensor, name, None) or {} for kind, name in _TENSOR_DICTS}


def global_hooks() -> dict[str, Mapping[int, Callable[..., Any]]]:
    """The global module hooks registered by anyone, by kind (`GLOBAL_HOOK_KINDS`)."""
    if not is_available("global_hooks"):
        return {}
    return {kind: getattr(module_globals, name) for kind, name in _GLOBAL_DICTS}


def handle_key(handle: Any) -> tuple[int, int]:
    """The key that identifies a torch `RemovableHandle`'s hook in the dicts above: (id of its dict, its id)."""
    hooks_dict = handle.hooks_dict_ref()
    return (id(hooks_dict) if hooks_dict is not None else 0, handle.id)


# ---- aten operators (the summary's FLOPs) ----------------------------------------------------------------------


def aten_ops(names: tuple[str, ...], counted: str) -> list[Any]:
    """The `torch.ops.aten` operators named `names` (several private: `_softmax`, `_native_batch_norm_legit` ...);
    those torch no longer has are left out after one warning saying that `counted` stops being counted."""
    found = [getattr(torch.ops.aten, name, None) for name in names]
    missing = [name for name, op in zip(names, found, strict=True) if op is None]
    key = f"{counted}: {missing}"
    if missing and key not in _WRAPPERS_WARNED:
        _WRAPPERS_WARNED.add(key)
        _warn(f"torch.ops.aten ({', '.join(missing)})", f"the {counted} of these operators are not counted")
    return [op for op in found if op is not None]


# ---- modules -----------------------------------------------------------------------------------------------------


def children(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """`module`'s direct children by name, each registration (a child registered under two names twice;
    `named_children()` gives it once)."""
    if not is_available("modules_dict"):
        return list(module.named_children())
    return [(name, child) for name, child in module._modules.items() if child is not None]


# ---- wrappers and compiled modules ------------------------------------------------------------------------------

_WRAPPERS_WARNED: set[str] = set()


def wrapped_module(module: nn.Module) -> nn.Module | None:
    """The module inside a torch wrapper (DDP, DataParallel, FSDP1, torch.compile, activation checkpointing), or
    `None` when `module` is not one; a wrapper without the attribute expected warns once and is kept as it is."""
    found = _WRAPPERS.get(type(module).__name__)
    if found is None:
        return None
    attribute, _ = found
    inner = getattr(module, attribute, None)
    if isinstance(inner, nn.Module):
        return inner
    name = type(module).__name__
    if name not in _WRAPPERS_WARNED:
        _WRAPPERS_WARNED.add(name)
        reliance = RELIANCES["wrappers"]
        _warn(f"{name}.{attribute} ({reliance.what})", reliance.stops)
    return None


def is_compile_wrapper(module: nn.Module) -> bool:
    """Whether `module` is the wrapper `torch.compile(module)` returns (torch names it `OptimizedModule`)."""
    return type(module).__name__ == "OptimizedModule"


def is_compiled_in_place(module: nn.Module) -> bool:
    """Whether `module.compile()` was called on `module` (`False` when torch no longer says, after one warning)."""
    return is_available("compiled_call_impl") and getattr(module, "_compiled_call_impl", None) is not None
