"""Monitors of the forward pass: inputs, outputs, an attribute, and an attribute's change across forward."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from .._check import checked
from ..hooks import HookHandle
from ..hooks._tree import map_tensors, tensor_leaves
from ..reducers._base import Reducer
from ._base import Monitor, MonitorConstructor
from ._parts import Construct, as_tensors, check_attribute, resolve

__all__ = ["DifferenceMonitor", "InputMonitor", "OutputMonitor", "StateMonitor"]


class InputMonitor(Monitor):
    """Record the inputs of a module, before its forward runs.

    `filter_` and `map_` receive one tuple: the positional inputs followed by the values of the keyword
    inputs, in call order. By default an observation is kept when it holds a tensor, and every tensor in it is
    pushed, in order (inferno's: the inputs unpacked into the reducer); a reducer that follows one tensor then
    needs a `map_` for a module called with several.
    Arguments as in `Monitor`.

    Example:
        >>> import torch, torch.nn as nn
        >>> from hookscope import HistoryReducer
        >>> layer = nn.Linear(3, 2)
        >>> with InputMonitor(HistoryReducer(), module=layer) as monitor:
        ...     _ = layer(torch.ones(4, 3))
        >>> monitor.dump().shape
        torch.Size([1, 4, 3])
    """

    def _attach(self, module: nn.Module) -> list[HookHandle]:
        return [self._hook(module, "forward_pre", self._on_input, with_kwargs=True)]

    def _on_input(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._admits(module):
            self._record((*args, *kwargs.values()) if kwargs else args)


class OutputMonitor(Monitor):
    """Record the outputs of a module, after its forward.

    `filter_` and `map_` receive the output as the module returned it (a tensor, a tuple, a dict, a
    namedtuple, `None` ...). By default an output is kept when it holds a tensor, and every tensor in it is
    pushed (depth first); reducers that follow one tensor then need a `map_` for multi-tensor outputs.
    Arguments as in `Monitor`.

    Example:
        >>> import torch, torch.nn as nn
        >>> from hookscope import StatsReducer
        >>> relu = nn.ReLU()
        >>> with OutputMonitor(StatsReducer(), module=relu) as monitor:
        ...     _ = relu(torch.tensor([-1.0, 3.0]))
        >>> monitor.peek().mean.item()
        1.5
    """

    def _attach(self, module: nn.Module) -> list[HookHandle]:
        return [self._hook(module, "forward", self._on_output)]

    def _on_output(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._admits(module):
            self._record(output)


class StateMonitor(Monitor):
    """Record an attribute of a module (dotted for nested ones: `"a.b"`), after or before its forward.

    The hook stays on the module registered, whatever object holds the nested attribute. By default a value
    is kept when it is not `None`; tensors in it (numbers become 0-d tensors) are pushed.

    Args:
        reducer: Where observations go.
        attr: The attribute, dotted for nested ones.
        module: The module to watch.
        as_prehook: Read the attribute before the forward instead of after it.
        train_update: Record in train mode.
        eval_update: Record in eval mode.
        prepend: Run before the hooks already on the module.
        filter_: `filter_(value) -> bool`.
        map_: `map_(value) -> tensor or tuple of tensors`.
        strict: As `Monitor`.

    Raises:
        ValueError: `module` has no attribute `attr` (the closest names are listed).
    """

    @checked()
    def __init__(
        self,
        reducer: Reducer,
        attr: str,
        module: nn.Module | None = None,
        as_prehook: bool = False,
        train_update: bool = True,
        eval_update: bool = True,
        prepend: bool = False,
        filter_: Callable[..., bool] | None = None,
        map_: Callable[..., Any] | None = None,
        *,
        strict: bool | None = None,
    ) -> None:
        self.attr = attr
        self.as_prehook = as_prehook
        super().__init__(reducer, module, train_update, eval_update, prepend, filter_, map_, strict=strict)

    def _check_target(self, module: nn.Module) -> None:
        check_attribute(module, self.attr)

    def _attach(self, module: nn.Module) -> list[HookHandle]:
        return [self._hook(module, "forward_pre" if self.as_prehook else "forward", self._on_call)]

    def _on_call(self, module: nn.Module, *_: Any) -> None:
        if self._admits(module):
            self._record(resolve(module, self.attr))

    def _default_filter(self, *observation: Any) -> bool:
        return observation[0] is not None

    def _default_map(self, *observation: Any) -> Any:
        return as_tensors(observation[0])

    @classmethod
    def partialconstructor(  # type: ignore[override]  # takes the issue's extra arguments
        cls,
        reducer: Reducer,
        as_prehook: bool = False,
        train_update: bool = True,
        eval_update: bool = True,
        prepend: bool = False,
        filter_: Callable[..., bool] | None = None,
        map_: Callable[..., Any] | None = None,
    ) -> MonitorConstructor:
        """Return `(attr, module) -> StateMonitor` for attribute `attr` of `module`.

        Every argument is passed through; each monitor gets its own copy of `reducer`.
        """

        rest = (as_prehook, train_update, eval_update, prepend, filter_, map_)
        return Construct(cls, reducer, rest, attr_is_argument=True)


class _Gated:
    """Marks a call that began while recording was off for the module's mode."""


_GATED = _Gated()


class DifferenceMonitor(Monitor):
    """Record the change of an attribute of a module across its forward call.

    `attr` may be dotted (`"a.b"`); the hooks stay on the module registered. The left-hand argument of
    `filter_`, `map_` and `op_` is the value after forward, the right-hand the value before it (a detached
    copy, so in-place updates such as BatchNorm's running statistics are seen). By default `filter_` rejects
    an observation only when both values are `None`; the default `map_` replaces a `None` side (not both) by
    zeros shaped like the other, applies `op_(post, pre)` (subtraction by default) and wraps the result in a
    tuple. A user's `map_` receives the raw values (and `op_` is then unused). Calls are paired last-in,
    first-out per thread, so a module re-entered or shared across threads pairs each call with its own
    "before"; a forward that raises is counted in `counts["incomplete"]` and records nothing.

    Args:
        reducer: Where observations go.
        attr: The attribute, dotted for nested ones.
        module: The module to watch.
        train_update: Record in train mode.
        eval_update: Record in eval mode.
        prepend: Run before the hooks already on the module (both the pre- and the post-forward hook).
        filter_: `filter_(post, pre) -> bool`.
        map_: `map_(post, pre) -> tensor or tuple of tensors`.
        op_: `op_(post, pre) -> difference`, used by the default `map_`.
        strict: As `Monitor`.

    Raises:
        ValueError: `module` has no attribute `attr`.

    Example:
        >>> import torch, torch.nn as nn
        >>> from hookscope import HistoryReducer
        >>> norm = nn.BatchNorm1d(2)
        >>> with DifferenceMonitor(HistoryReducer(), "running_mean", module=norm) as monitor:
        ...     _ = norm(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        >>> [round(change, 4) for change in monitor.peek().tolist()]
        [0.2, 0.3]
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
        filter_: Callable[[Any, Any], bool] | None = None,
        map_: Callable[[Any, Any], Any] | None = None,
        op_: Callable[[Any, Any], Any] | None = None,
        *,
        strict: bool | None = None,
    ) -> None:
        self.attr = attr
        self.op_ = op_ if op_ is not None else _subtract
        self._pending = threading.local()
        super().__init__(reducer, module, train_update, eval_update, prepend, filter_, map_, strict=strict)

    def _check_target(self, module: nn.Module) -> None:
        check_attribute(module, self.attr)

    def _attach(self, module: nn.Module) -> list[HookHandle]:
        before = self._hook(module, "forward_pre", self._before)
        return [before, self._hook(module, "forward", self._after, always_call=True)]

    def _stack(self) -> list[Any]:
        stack: list[Any] | None = getattr(self._pending, "stack", None)
        if stack is None:
            stack = self._pending.stack = []
        return stack

    def _before(self, module: nn.Module, *_: Any) -> None:
        if self._observed is None or module is not self._observed():
            return
        admitted = self._admits(module)
        self._stack().append(_snapshot(resolve(module, self.attr)) if admitted else _GATED)

    def _after(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._observed is None or module is not self._observed():
            return
        stack = self._stack()
        if not stack:  # registered during this very call: no "before" to pair with
            return
        before = stack.pop()
        if before is _GATED:
            return
        if output is None and sys.exc_info()[1] is not None:  # always_call after a failed forward
            self._bump("incomplete")
            return
        self._record(resolve(module, self.attr), before)

    def _clear_pending(self) -> None:
        self._pending = threading.local()

    def _default_filter(self, *observation: Any) -> bool:
        post, pre = observation
        return not (post is None and pre is None)

    def _default_map(self, *observation: Any) -> Any:
        post, pre = observation
        post = _zeros_like(pre) if post is None else post
        pre = _zeros_like(post) if pre is None else pre
        return as_tensors(self.op_(post, pre))

    @classmethod
    def partialconstructor(  # type: ignore[override]  # takes the issue's extra arguments
        cls,
        reducer: Reducer,
        train_update: bool = True,
        eval_update: bool = True,
        prepend: bool = False,
        filter_: Callable[[Any, Any], bool] | None = None,
        map_: Callable[[Any, Any], Any] | None = None,
        op_: Callable[[Any, Any], Any] | None = None,
    ) -> MonitorConstructor:
        """Return `(attr, module) -> DifferenceMonitor` for attribute `attr` of `module`.

        Every argument is passed through, `op_` included; each monitor gets its own copy of `reducer`.
        """

        rest = (train_update, eval_update, prepend, filter_, map_, op_)
        return Construct(cls, reducer, rest, attr_is_argument=True)


def _snapshot(value: Any) -> Any:
    return map_tensors(value, lambda tensor: tensor.detach().clone())


def _zeros_like(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    return map_tensors(value, torch.zeros_like) if any(True for _ in tensor_leaves(value)) else 0


def _subtract(post: Any, pre: Any) -> Any:
    return post - pre
