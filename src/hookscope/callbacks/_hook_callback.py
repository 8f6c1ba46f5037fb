"""`HookCallback`: fastai's callback that places hooks on modules for the length of a fit (or of some batches)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from .._check import checked
from .._torch import children
from ..hooks import HookHandle, named_modules, register_module_hook
from ..hooks._calls import HookErrors
from ..hooks._select import Selector, choose_modules, has_own_params
from ..hooks._tree import map_tensors
from ._base import Callback

__all__ = ["HookCallback"]

HookFunction = Callable[[nn.Module, Any, Any], Any]


class HookCallback(Callback):
    """Register `hook(m, i, o)` on `modules` when training starts; remove it at the end (fastai's HookCallback).

    The hook is the `hook` method a subclass implements, or the function passed as `hook`; what it returns for
    each module is kept in `stored` (model order). It receives detached (`detach=True`) CPU copies
    (`cpu=True`) of the inputs and output, or, with `is_forward=False`, of the gradients
    `(m, grad_input, grad_output)` from a full backward hook. With `every=N`, the hooks are on the modules only
    during the training batches whose index (from 0) is a multiple of N (paused in between: registered once, no
    cost to the other batches); with `every=None`, from fit start to fit end.

    fastai's events are here too, with fastai's meaning: `on_fit_start` runs `before_fit()` (resolve `modules`,
    then read as the list of hooked modules, and register), `on_batch_start` sets `train_iter` and runs
    `before_batch()`, `on_batch_end` runs `after_batch()`, `on_fit_end` runs `after_fit()`; a subclass written for
    fastai overrides them as it did there (calling `super()` where fastai's did). `hooks.stored` is fastai's
    spelling of `stored`.

    Args:
        modules: The modules to hook: a list of modules of the model, or any `hookscope.hooks` selector; `None`
            (default) means every module with parameters of its own.
        every: Observe one training batch in `every` (`None`: all of them).
        remove_end: Remove the hooks when the fit ends normally (they are always removed when it raises).
        is_forward: Forward hooks (`True`) or full backward hooks (`False`).
        detach: Pass detached tensors to the hook.
        cpu: Pass CPU copies to the hook.
        include_paramless: With `modules=None`, also hook the leaf modules without parameters (fastai's
            `ReLU`, `Flatten` ...).
        hook: A function `hook(m, i, o) -> Any` to use instead of the `hook` method.

    Raises:
        ValueError: `every` is not a positive int or `None`.
        TypeError: `hook` is not callable.

    Example:
        >>> import torch, torch.nn as nn
        >>> model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
        >>> shapes = HookCallback(hook=lambda m, i, o: tuple(o.shape))
        >>> with shapes.attach(model):
        ...     _ = model(torch.zeros(5, 3))
        >>> shapes.stored
        [(5, 4), (5, 1)]
    """

    @checked()
    def __init__(
        self,
        modules: Selector = None,
        every: int | None = None,
        remove_end: bool = True,
        is_forward: bool = True,
        detach: bool = True,
        cpu: bool = True,
        include_paramless: bool = False,
        hook: HookFunction | None = None,
    ) -> None:
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(f"every must be a positive int or None, got {every!r}")
        if hook is not None:
            if not callable(hook):
                raise TypeError(f"hook must be callable (m, i, o) -> Any, got {type(hook).__name__}")
            self.hook = hook  # type: ignore[method-assign,assignment]
        self._selector = modules
        self.every = every
        self.remove_end, self.is_forward, self.detach, self.cpu = remove_end, is_forward, detach, cpu
        self.include_paramless = include_paramless
        self.train_iter = 0
        self.paths: list[str] = []
        self._fit: weakref.ref[nn.Module] | None = None
        self._fit_error: BaseException | None = None
        self.stored: list[Any] = []
        self._module_refs: list[weakref.ref[nn.Module]] = []
        self._handles: list[HookHandle] = []
        self._placed = False  # the hooks are on the modules (registered and not paused)

    def hook(self, m: nn.Module, i: Any, o: Any) -> Any:
        """Compute what to keep for module `m` from its input `i` and output `o` (override this)."""
        return None

    @property
    def modules(self) -> Any:
        """The modules hooked (those still alive, model order) once a fit started, as fastai; before, the
        `modules` argument. Setting it chooses the modules of the next fit."""
        return self.hooked_modules if self._fit is not None else self._selector

    @modules.setter
    def modules(self, modules: Selector) -> None:
        self._selector, self._fit = modules, None

    @property
    def hooked_modules(self) -> list[nn.Module]:
        """The modules this callback hooks (those still alive), in model order."""
        return [m for m in (ref() for ref in self._module_refs) if m is not None]

    @property
    def hooks(self) -> CallbackHooks:
        """fastai's `self.hooks`: `hooks.stored` is `stored`, `hooks.remove()` removes the hooks."""
        return CallbackHooks(self)

    @property
    def is_registered(self) -> bool:
        """Whether the hooks are currently in place (registered, not paused)."""
        return self._placed

    def on_fit_start(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Run `before_fit()` on `model`."""
        self._fit, self._fit_error, self.train_iter = weakref.ref(model), None, 0
        self.before_fit()

    def before_fit(self) -> None:
        """Resolve `modules` on the model; with `every=None`, register the hooks (fastai's `before_fit`)."""
        model = self._fit() if self._fit is not None else None
        if model is None:
            raise RuntimeError("HookCallback.before_fit() runs inside a fit: attach the callback to a model first")
        chosen = _resolve(model, self._selector, self.include_paramless)
        self.paths = [path for path, _ in chosen]
        self._module_refs = [weakref.ref(m) for _, m in chosen]
        self.stored = [None] * len(chosen)
        if self.every is None:
            self.register()

    def on_batch_start(self, batch: int) -> None:
        """Set `train_iter` to `batch` and run `before_batch()`."""
        self.train_iter = batch
        self.before_batch()

    def before_batch(self) -> None:
        """With `every=N`, register the hooks on the batches that are multiples of N (fastai's `before_batch`)."""
        if self.every is not None and self.train_iter % self.every == 0:
            self.register()

    def on_batch_end(self, batch: int) -> None:
        """Run `after_batch()`."""
        self.after_batch()

    def after_batch(self) -> None:
        """With `every=N`, take the hooks off after an observed batch (fastai's `after_batch`; paused, not
        removed: the next observed batch puts them back)."""
        if self.every is not None:
            self.pause()

    def on_fit_end(self, error: BaseException | None = None) -> None:
        """Run `after_fit()` (`error` is the exception that ended the fit, if any)."""
        self._fit_error = error
        self.after_fit()

    def after_fit(self) -> None:
        """Remove the hooks, unless `remove_end=False` and the fit ended normally (fastai's `after_fit`)."""
        if self.remove_end or self._fit_error is not None:
            self.remove()

    def register(self) -> None:
        """Place the hooks on the resolved modules (paused ones go back; nothing happens when they are placed)."""
        if self._handles:
            for handle in self._handles:
                handle.resume()
            self._placed = True
            return
        kind = "forward" if self.is_forward else "backward"
        try:
            for index, (path, ref) in enumerate(zip(self.paths, self._module_refs, strict=True)):
                module = ref()
                if module is not None:
                    hook = self._make_hook(index)
                    handle = register_module_hook(
                        module, kind, hook, owner=self, path=path, tags=_TAGS, errors=self._hook_errors()
                    )
                    self._handles.append(handle)
        except BaseException:
            self.remove()
            raise
        self._placed = bool(self._handles)

    def _hook_errors(self) -> HookErrors | None:
        """Where failures of the hooks go: `None` here (the hook is the user's: re-raised, naming the module)."""
        return None

    def pause(self) -> None:
        """Take the hooks off the modules until `register()` puts them back (they stay registered)."""
        for handle in self._handles:
            handle.pause()
        self._placed = False

    def remove(self) -> None:
        """Remove the hooks; calling it again does nothing."""
        self._placed = False
        while self._handles:
            self._handles.pop().remove()

    def _make_hook(self, index: int) -> HookFunction:
        stored = self.stored
        prepare = self._prepare if (self.detach or self.cpu) else None

        def hook_fn(module: nn.Module, inputs: Any, output: Any) -> None:
            if prepare is not None:
                inputs, output = map_tensors((inputs, output), prepare)
            stored[index] = self.hook(module, inputs, output)

        return hook_fn

    def _prepare(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.detach:
            tensor = tensor.detach()
        return tensor.cpu() if self.cpu else tensor


_TAGS = ("HookCallback",)


class CallbackHooks:
    """fastai's `HookCallback.hooks` seen from hookscope: the stored values and removal, one per hooked module."""

    def __init__(self, callback: HookCallback) -> None:
        self._callback = callback

    @property
    def stored(self) -> list[Any]:
        """What the hook returned for each hooked module (model order); `None` where it has not run."""
        return self._callback.stored

    def remove(self) -> None:
        """Remove the callback's hooks; calling it again does nothing."""
        self._callback.remove()

    def __len__(self) -> int:
        return len(self._callback.stored)


def _resolve(model: nn.Module, modules: Selector, include_paramless: bool = False) -> list[tuple[str, nn.Module]]:
    if isinstance(modules, (list, tuple)) and modules and all(isinstance(m, nn.Module) for m in modules):
        ids = {id(m) for m in modules}
        chosen = [(path, m) for path, m in named_modules(model) if id(m) in ids]
        if len(chosen) != len(ids):
            raise ValueError(
                f"modules must all be modules of the model, got {len(ids) - len(chosen)} that are not (pass modules "
                "of the model being trained, or a path selector such as 'encoder.*')"
            )
        return chosen
    if modules is None and include_paramless:  # fastai: every leaf module, with parameters or not
        return [(path, m) for path, m in named_modules(model) if has_own_params(m) or not children(m)]
    return choose_modules(model, modules, "modules")
