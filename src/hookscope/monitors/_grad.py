"""Monitors of the backward pass: gradients of a module's outputs, and of a parameter once accumulated."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from .._check import checked
from ..hooks import HookHandle, register_output_grad_hook, register_post_accumulate_grad_hook
from ..reducers._base import Reducer
from ._base import TAG, Monitor, MonitorConstructor
from ._parts import Construct, check_attribute, resolve

__all__ = ["OutputGradMonitor", "ParameterGradMonitor"]


class OutputGradMonitor(Monitor):
    """Record d loss / d output of a module, for each call whose output took part in the backward.

    Gradients are caught with tensor hooks on the outputs (`hookscope.hooks.register_output_grad_hook`), so an
    in-place op after the module and nested outputs work, and a module called k times in one forward records
    k observations, each paired with its own call. They arrive in backward order: the last call first.
    `filter_` and `map_` receive the tuple of gradients (one per output tensor that required grad, `None`
    where none arrived); by default an observation is kept when one gradient is not `None`, and the gradients
    that are not `None` are pushed. Train/eval gating reads the module's mode at backward time. Arguments as
    in `Monitor`.

    Example:
        >>> import torch, torch.nn as nn
        >>> from hookscope import HistoryReducer
        >>> layer = nn.Linear(3, 1)
        >>> with OutputGradMonitor(HistoryReducer(), module=layer) as monitor:
        ...     layer(torch.ones(2, 3)).sum().backward()
        >>> monitor.peek().tolist()
        [[1.0], [1.0]]
    """

    def _attach(self, module: nn.Module) -> list[HookHandle]:
        return [
            register_output_grad_hook(
                module, self._weak(self._on_grad), owner=self, path=self._path, tags=(TAG,), errors=self.errors
            )
        ]

    def _on_grad(self, module: nn.Module, grads: tuple[torch.Tensor | None, ...], call_index: int) -> None:
        if self._admits(module):
            self._record(grads)

    def _default_filter(self, *observation: Any) -> bool:
        return any(grad is not None for grad in observation[0])

    def _default_map(self, *observation: Any) -> Any:
        return tuple(grad for grad in observation[0] if grad is not None)


class ParameterGradMonitor(Monitor):
    """Record the gradient of a parameter of a module once it is fully accumulated for a backward.

    Uses post-accumulate-grad hooks: a parameter used twice in the graph is seen once, with its summed
    gradient, and the hook fires under FSDP2, where `param.register_hook` does not. Under gradient
    accumulation, each backward records `param.grad` as accumulated so far. `filter_` and `map_` receive
    `param.grad`; by default it is kept when not `None` and pushed as is. `prepend` has no effect here: torch
    runs post-accumulate-grad hooks in registration order.

    Args:
        reducer: Where observations go.
        attr: The parameter's name on `module`, dotted for nested ones (`"weight"`, `"0.bias"`).
        module: The module that holds it (its train/eval mode gates recording).
        train_update: Record in train mode.
        eval_update: Record in eval mode.
        prepend: Accepted for a uniform signature; no effect.
        filter_: `filter_(grad) -> bool`.
        map_: `map_(grad) -> tensor or tuple of tensors`.
        strict: As `Monitor`.

    Raises:
        ValueError: `module` has no attribute `attr`, or it is not a tensor that requires grad.

    Example:
        >>> import torch, torch.nn as nn
        >>> from hookscope import HistoryReducer
        >>> layer = nn.Linear(2, 1, bias=False)
        >>> with ParameterGradMonitor(HistoryReducer(), "weight", module=layer) as monitor:
        ...     layer(torch.tensor([[1.0, 2.0]])).sum().backward()
        >>> monitor.peek().tolist()
        [[1.0, 2.0]]
    """

    @checked()
    def __init__(
        self,
        reducer: Reducer,
        attr: str,
        module: nn.Module | None = None,
        train_update: bool = True,
        eval_update: bool = True,
        prepend: bool = False,
        filter_: Callable[..., bool] | None = None,
        map_: Callable[..., Any] | None = None,
        *,
        strict: bool | None = None,
    ) -> None:
        self.attr = attr
        self._parameter: weakref.ref[torch.Tensor] | None = None
        super().__init__(reducer, module, train_update, eval_update, prepend, filter_, map_, strict=strict)

    def _detached_copy(self) -> None:
        self._parameter = None

    def _check_target(self, module: nn.Module) -> None:
        check_attribute(module, self.attr)
        parameter = resolve(module, self.attr)
        if not isinstance(parameter, torch.Tensor) or not parameter.is_leaf or not parameter.requires_grad:
            raise ValueError(
                f"attr must name a leaf tensor that requires grad (a trainable parameter), got {self.attr!r} "
                f"holding a {type(parameter).__name__}"
            )

    def _attach(self, module: nn.Module) -> list[HookHandle]:
        parameter = resolve(module, self.attr)
        self._parameter = weakref.ref(parameter)
        hook = self._weak(self._on_accumulated)
        return [
            register_post_accumulate_grad_hook(
                parameter, hook, owner=self, path=self._path, tags=(TAG,), errors=self.errors
            )
        ]

    def _on_accumulated(self, parameter: torch.Tensor) -> None:
        module = self.module
        if self._parameter is None or parameter is not self._parameter() or module is None:
            return
        if self._admits(module):
            self._record(parameter.grad)

    def _default_filter(self, *observation: Any) -> bool:
        return observation[0] is not None

    def _default_map(self, *observation: Any) -> Any:
        return observation[0]

    @classmethod
    def partialconstructor(  # type: ignore[override]  # takes the issue's extra arguments
        cls,
        reducer: Reducer,
        train_update: bool = True,
        eval_update: bool = True,
        prepend: bool = False,
        filter_: Callable[..., bool] | None = None,
        map_: Callable[..., Any] | None = None,
    ) -> MonitorConstructor:
        """Return `(attr, module) -> ParameterGradMonitor` for parameter `attr` of `module`.

        Every argument is passed through; each monitor gets its own copy of `reducer`.
        """

        return Construct(cls, reducer, (train_update, eval_update, prepend, filter_, map_), attr_is_argument=True)
