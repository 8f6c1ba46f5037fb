"""The fastai hook vocabulary: `Hook`, `Hooks`, `hook_output`, `hook_outputs`, built on the registry."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from .._check import check_callable, checked
from ._grad import register_output_grad_hook
from ._guards import check_hookable
from ._module import register_module_hook
from ._registry import HookHandle
from ._tree import map_tensors

__all__ = ["Hook", "Hooks", "hook_output", "hook_outputs"]

HookFunc = Callable[[nn.Module, Any, Any], Any]


class Hook:
    """Register `hook_func(module, input, output)` on `m` and keep what it returns in `.stored`.

    With `is_forward=False` the hook runs in backward as `hook_func(module, grad_input, grad_output)` (a full
    backward hook). The arguments are detached first (`detach=True`), moved to the CPU (`cpu=True`) and gathered
    across ranks along the first dimension when torch.distributed is initialized (`gather=True`). The hook holds
    no reference to `m`, so a model that is deleted is freed even while hooked.

    Example:
        >>> import torch, torch.nn as nn
        >>> lin = nn.Linear(3, 2)
        >>> with Hook(lin, lambda m, i, o: o.shape) as h:
        ...     _ = lin(torch.zeros(5, 3))
        >>> h.stored
        torch.Size([5, 2])
    """

    @checked()
    def __init__(
        self,
        m: nn.Module,
        hook_func: HookFunc,
        is_forward: bool = True,
        detach: bool = True,
        cpu: bool = False,
        gather: bool = False,
    ) -> None:
        check_hookable(m, "m")
        check_callable("hook_func", hook_func, 3, "hook_func(module, input, output) -> Any")
        self.hook_func = hook_func
        self.is_forward, self.detach, self.cpu, self.gather = is_forward, detach, cpu, gather
        self.stored: Any = None
        self.call_index = 0
        self.handle = self._register(m)

    def __reduce__(self) -> tuple[type[_InertHook], tuple[()]]:
        # torch.save(model) and copy.deepcopy(model) reach this object through the module's hook dict: the copy
        # gets a hook that records nothing, so it never writes into this one and no stored data is serialized.
        return (_InertHook, ())

    def _register(self, m: nn.Module) -> HookHandle:
        kind = "forward" if self.is_forward else "backward"
        return register_module_hook(m, kind, self.hook_fn, owner=self, tags=("Hook",))

    def hook_fn(self, module: nn.Module, input: Any, output: Any) -> None:
        """Transform the arguments as configured, run `hook_func` and store its result."""
        if self.detach or self.cpu or self.gather:
            input, output = map_tensors((input, output), self._prepare)
        self.stored = self.hook_func(module, input, output)

    def _prepare(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.detach:
            tensor = tensor.detach()
        if self.cpu:
            tensor = tensor.cpu()
        if self.gather:
            tensor = gather_tensor(tensor)
        return tensor

    @property
    def removed(self) -> bool:
        """Whether the hook was removed."""
        return self.handle.is_removed

    def remove(self) -> None:
        """Remove the hook; calling it again does nothing."""
        self.handle.remove()

    def __enter__(self) -> Hook:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


class _InertHook:
    """Stands in for a `Hook` inside a pickled or deep-copied model: every hook method records nothing.

    `copy.deepcopy` keeps a bound method's function and copies only its `self`, so `Hook.hook_fn` may run with
    this object as `self`: the attributes below make it store `None` here and nowhere else.
    """

    stored = None
    detach = cpu = gather = False
    call_index = 0

    @staticmethod
    def hook_func(*args: Any) -> None:
        return None

    def hook_fn(self, *args: Any) -> None:
        return None

    def _on_grads(self, *args: Any) -> None:
        return None


class _OutputGradHook(Hook):
    """A `Hook` on the gradient of a module's outputs, robust to in-place ops and nested outputs."""

    def _register(self, m: nn.Module) -> HookHandle:
        return register_output_grad_hook(m, self._on_grads, owner=self, tags=("Hook", "grad"))

    def _on_grads(self, module: nn.Module, grad_output: tuple[torch.Tensor | None, ...], call_index: int) -> None:
        self.call_index = call_index
        self.hook_fn(module, None, grad_output)


class Hooks:
    """One `Hook` per module of `ms` (an iterable of modules, or a module: its direct children).

    `.stored` lists the stored values in module order; supports `len`, indexing, iteration and `with`.
    """

    @checked()
    def __init__(
        self,
        ms: nn.Module | Iterable[nn.Module],
        hook_func: HookFunc,
        is_forward: bool = True,
        detach: bool = True,
        cpu: bool = False,
    ) -> None:
        modules = _as_modules(ms, "ms")
        check_callable("hook_func", hook_func, 3, "hook_func(module, input, output) -> Any")
        self.hooks: list[Hook] = []
        try:
            for module in modules:
                self.hooks.append(Hook(module, hook_func, is_forward, detach, cpu))
        except BaseException:
            self.remove()
            raise

    @classmethod
    def _of(cls, hooks: list[Hook]) -> Hooks:
        new = cls.__new__(cls)
        new.hooks = hooks
        return new

    def __getitem__(self, index: int) -> Hook:
        return self.hooks[index]

    def __len__(self) -> int:
        return len(self.hooks)

    def __iter__(self) -> Iterator[Hook]:
        return iter(self.hooks)

    @property
    def stored(self) -> list[Any]:
        """The stored value of each hook, in module order."""
        return [hook.stored for hook in self.hooks]

    def remove(self) -> None:
        """Remove every hook; calling it again does nothing."""
        for hook in self.hooks:
            hook.remove()

    def __enter__(self) -> Hooks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def _hook_inner(module: nn.Module, input: Any, output: Any) -> Any:
    # fastai turns other iterables into lists; None, dicts, strings and objects are kept as they are. An iterator
    # (a generator) is kept as it is: listing it would consume it, and the model's caller would get it empty.
    if isinstance(output, (torch.Tensor, list, tuple, dict, str, Iterator)) or not isinstance(output, Iterable):
        return output
    return list(output)


@checked()
def hook_output(module: nn.Module, detach: bool = True, cpu: bool = False, grad: bool = False) -> Hook:
    """Store the output of `module` in `.stored`; with `grad=True`, the tuple of gradients of its outputs.

    With `grad=True`, `h.stored[0]` is d loss / d output; it uses output tensor hooks, so it works when an
    in-place op follows the module and when the module returns dicts or tuples.
    """
    if grad:
        return _OutputGradHook(module, _hook_inner, True, detach, cpu)
    return Hook(module, _hook_inner, True, detach, cpu)


@checked()
def hook_outputs(
    modules: nn.Module | Iterable[nn.Module], detach: bool = True, cpu: bool = False, grad: bool = False
) -> Hooks:
    """`hook_output` on each of `modules` (a module means its direct children), as one `Hooks`."""
    hooks: list[Hook] = []
    try:
        for module in _as_modules(modules, "modules"):
            hooks.append(hook_output(module, detach, cpu, grad))
    except BaseException:
        for hook in hooks:
            hook.remove()
        raise
    return Hooks._of(hooks)


def _as_modules(ms: nn.Module | Iterable[nn.Module], argument: str) -> list[nn.Module]:
    modules = list(ms.children()) if isinstance(ms, nn.Module) else list(ms)
    for module in modules:
        check_hookable(module, f"each of {argument}")
    if not modules:
        what = f"a {type(ms).__name__} without children" if isinstance(ms, nn.Module) else repr(ms)
        raise ValueError(f"{argument} must hold at least one module to hook, got {what}; pass the modules to hook")
    return modules


def gather_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate `tensor` from every rank along dim 0 (sizes may differ); itself when not distributed."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensor
    tensor = tensor.contiguous() if tensor.dim() else tensor.reshape(1)
    sizes = [torch.zeros(1, dtype=torch.long, device=tensor.device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([tensor.shape[0]], device=tensor.device))
    longest = int(max(int(s) for s in sizes))
    padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([part[: int(size)] for part, size in zip(parts, sizes, strict=True)])
