"""What a training step is and which forwards belong to it: the one rule every hookscope recorder follows.

A step is one optimizer step when there is an optimizer, and otherwise one training forward of the root model with
the backward(s) through it. With a closure (`torch.optim.LBFGS`, `optimizer.step(closure)`), the forwards and
backwards the closure runs inside `step()` belong to that one step.

A forward of the root model belongs to the open step when it
    * runs with gradients: not under `torch.no_grad()` or `torch.inference_mode()` (metrics, predictions, an EMA
      teacher's pass are not training);
    * runs in training mode (`train_only=False` counts every forward, whatever its mode and grad mode);
    * completes: a forward that raised (an out-of-memory retry loop) is discarded, not merged.
Calls of the root's submodules inside such a forward belong to it whatever they do inside (a checkpointed block
runs its first pass under `no_grad`); calls made outside any root forward follow the same three conditions on
their own.

Labelled, not merged:
    * recomputations: `torch.utils.checkpoint` (reentrant or not) runs forwards again during backward. They are
      counted once (the recomputation is counted in `dropped["recompute"]`); their output gradients are still
      observed, once.
    * a second backward through the same forward (`backward(retain_graph=True)` twice): output gradients are
      those of the first backward (the later ones are counted in `dropped["retain_graph"]`), parameter gradients
      are what the optimizer uses (`.grad`, summed over the backwards), and the step is listed in
      `meta["step_labels"]["retain_graph"]`.
    * a step a `GradScaler` skipped is a step of its own, listed in `skipped_steps` (`watch(scaler=)`);
    * a step whose optimizer step never came (the run ended first, or the model ran once more after its last step,
      as a GAN's discriminator does for the generator's loss) is kept and listed in
      `meta["step_labels"]["unfinished"]`.

`uncounted` says why a forward is not part of a step; `ForwardFrames` follows the root forwards running in each
thread, so that what their hooks saw is kept only once each forward has completed.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn as nn

from .._torch import graph_task_id
from ..hooks import HookHandle, register_module_hook
from ..hooks._calls import Eager, HookErrors

__all__ = ["ForwardFrames", "Frame", "in_backward", "uncounted"]


def in_backward() -> bool:
    """Whether this thread runs inside a backward pass now (a forward here is a recomputation)."""
    return graph_task_id() != -1


def uncounted(module: nn.Module, train_only: bool = True) -> str | None:
    """Why a forward of `module` starting now is not part of a training step, or `None` when it is.

    The reasons are the `dropped` keys: `"recompute"` (inside a backward), `"eval"` (eval mode), `"inference_mode"`,
    `"no_grad"`. With `train_only=False` only recomputations are left out.
    """
    if in_backward():
        return "recompute"
    if not train_only:
        return None
    if not module.training:
        return "eval"
    if torch.is_inference_mode_enabled():
        return "inference_mode"
    if not torch.is_grad_enabled():
        return "no_grad"
    return None


class Frame:
    """One forward of the root model in one thread: whether it counts, and what its hooks left to keep.

    Attributes:
        reason: `None` when the forward belongs to the open step, else why not (see `uncounted`).
        items: What the owner's hooks staged during the forward, kept only if it completes.
    """

    __slots__ = ("_outer", "items", "reason", "saved")

    def __init__(self, reason: str | None, outer: BaseException | None) -> None:
        self.reason = reason
        self.items: list[Any] = []
        self.saved: Any = None  # the owner's flags, set aside for the forward (`on_enter`)
        self._outer = outer  # the exception being handled when the forward began (a retry inside `except`)


class ForwardFrames:
    """Follow the forwards of one root model per thread, for one owner (a watch, an ActivationStats).

    Two hooks on the root: a forward pre-hook opens a `Frame` (is it part of a step?) and calls `on_enter(frame)`,
    an always-called forward hook closes it and calls `on_exit(frame, completed)`; `completed` is `False` when the
    forward raised. Both run eagerly under `torch.compile` (`on_enter` is where flags that traced hooks read are
    turned off for a forward that is not part of a step).

    Args:
        train_only: As `uncounted`.
        on_exit: Called with each closed frame and whether its forward completed; several (a tuple) are called in
            order, each for its own part (the watch's recorder keeps what its hooks staged, its stepper counts).
        on_enter: Called with each frame opened, if given.
    """

    def __init__(
        self,
        train_only: bool,
        on_exit: Callable[[Frame, bool], None] | tuple[Callable[[Frame, bool], None], ...],
        on_enter: Callable[[Frame], None] | None = None,
    ) -> None:
        self.train_only = train_only
        self._on_exit = on_exit if isinstance(on_exit, tuple) else (on_exit,)
        self._on_enter = on_enter
        self._local = threading.local()
        self._root: weakref.ref[nn.Module] | None = None

    def register(
        self, model: nn.Module, *, owner: object, tags: Iterable[str], errors: HookErrors | None
    ) -> list[HookHandle]:
        """Place the two hooks on `model`; return their handles."""
        self._root = weakref.ref(model)
        enter = register_module_hook(
            model, "forward_pre", Eager(self._enter), owner=owner, tags=tags, prepend=True, errors=errors
        )
        leave = register_module_hook(
            model, "forward", Eager(self._leave), owner=owner, tags=tags, always_call=True, errors=errors
        )
        return [enter, leave]

    def current(self) -> Frame | None:
        """The innermost root forward running in this thread, or `None` outside any."""
        stack: list[Frame] | None = getattr(self._local, "stack", None)
        return stack[-1] if stack else None

    def drop_current(self) -> None:
        """Forget the innermost root forward of this thread: its owner took the two hooks off the model while it
        ran (`HookHandle.pause`, from a forward pre-hook of the root), so its end will not be seen."""
        stack: list[Frame] | None = getattr(self._local, "stack", None)
        if stack:
            stack.pop()

    def _enter(self, module: nn.Module, args: Any) -> None:
        # equivalent mutant `or -> and`: the condition is false whenever this hook runs (it sits on the root alone,
        # placed after `_root` is set), so either operator gives false
        if self._root is None or module is not self._root():
            return
        stack: list[Frame] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        frame = Frame(uncounted(module, self.train_only), sys.exc_info()[1])
        stack.append(frame)
        if self._on_enter is not None:
            self._on_enter(frame)

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        # equivalent mutant `or -> and`: as in `_enter`
        if self._root is None or module is not self._root():
            return
        stack: list[Frame] | None = getattr(self._local, "stack", None)
        if not stack:  # registered during this very call
            return
        frame = stack.pop()
        # equivalent mutant `1 -> 2` (occurrence 1): `sys.exc_info()` is all None or all set, so [2] is None when [1] is
        # equivalent mutant `1 -> 0` (occurrence 1): as above, for [0]
        raised = output is None and sys.exc_info()[1] is not None and sys.exc_info()[1] is not frame._outer
        for on_exit in self._on_exit:
            on_exit(frame, not raised)
