"""`hookscope run`'s watcher: finds each model a script trains through global hooks and watches it.

A module called at the top of a forward (no other forward running in its thread) that belongs to a training step
(`hookscope.callbacks._steps.uncounted`: training mode, with gradients) and has trainable parameters is watched
from that very forward on, so the first training step is recorded, with the optimizer that holds most of its
parameters (optimizers are noted as the script creates them: `torch.optim.Optimizer.__init__` is wrapped while
`hookscope run` runs). An optimizer made later gets the model at its first step (`Watch.attach_optimizer`).
Models never updated by an optimizer (a hand-written `p.data -= lr * p.grad`) stay watched, one step per training
forward and its backward. Models that no backward ever reached are left out of the report, with a note.

Losses: while `hookscope run` runs, `torch.autograd.backward` (what `loss.backward()` calls) is wrapped, so the
loss is the tensor whose backward was called (a loss module, `F.cross_entropy`, any expression, or the model's own
output when its forward computes the loss, as Hugging Face models do with `labels=`). It goes to the models whose
outputs that backward reached, and is logged to a model when the model's optimizer steps: the sum of the losses
backwarded into it since its previous step, also for the step that never came when a script ends
mid-accumulation (a loss belongs to the first step that uses it: the generator's loss of a GAN also reaches the
discriminator, but the generator's optimizer uses it first). With a closure, the step's loss is the closure's
first one (what `step(closure)` returns). Without an optimizer, each backward's loss is logged at once. Nothing
here may break the script: a failure inside these hooks is kept as a note for the report and printed once (raised
when `HOOKSCOPE_STRICT=1`).
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from .._torch import forward_pre_hooks, graph_task_id
from ..callbacks._steps import uncounted
from ..hooks import HookHandle, register_global_module_hook, register_global_optimizer_hook
from ..hooks._calls import default_strict
from ..hooks._tree import tensor_leaves
from ..watch._api import watch
from ..watch._watch import Watch

__all__ = ["RunSession", "WatchedModel"]

_TAGS = ("hookscope-run",)


@dataclass
class WatchedModel:
    """One model the script trained, the watch on it, and the inputs of its first forward (for the summary).

    The model is held strongly: its final weights and summary go into the report after the script's own
    references are gone (the session lives for one `hookscope run` only).
    """

    name: str
    model: nn.Module
    watcher: Watch
    first_args: tuple[Any, ...] = ()
    optimizer: weakref.ref[torch.optim.Optimizer] | None = None
    reached: bool = False  # a backward reached the model
    pending: list[_Loss] = field(default_factory=list)  # losses backwarded into it since its last step
    steps: int = 0  # its training steps so far (optimizer steps, or forwards with their backward without one)
    last_loss: torch.Tensor | None = None  # the loss logged at its last step (detached, on its device)


@dataclass(eq=False)
class _Loss:
    """One backward's loss (detached) and the models it reached."""

    value: torch.Tensor
    reached: list[WatchedModel] = field(default_factory=list)


class RunSession:
    """Watch every model a script trains; `install()` the hooks and the backward wrapper, `remove()` them after."""

    def __init__(
        self,
        every: int = 1,
        select: str | None = None,
        capacity: int | None = 1024,
        exact: bool = False,
        progress: Callable[[list[WatchedModel]], None] | None = None,
    ) -> None:
        self.every = every
        self.select = select
        self.capacity = capacity
        self.exact = exact
        self._progress = progress  # progress(watched models) after each step
        self.watched: list[WatchedModel] = []
        self.notes: list[str] = []
        self._roots: dict[int, WatchedModel] = {}
        self._bound: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[WatchedModel]] = weakref.WeakKeyDictionary()
        self._handles: list[HookHandle] = []
        self._local = threading.local()  # per thread: the depth of nested forwards
        self._lock = threading.RLock()
        self._backwards: dict[int, _Loss] = {}  # graph task id -> the loss being backwarded
        self._early: dict[int, list[WatchedModel]] = {}  # graph task id -> models reached before its loss was known
        self._original_backward: Callable[..., Any] | None = None
        self._original_init: Callable[..., Any] | None = None
        self._optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()  # made by the script
        self._stepping: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()  # inside their step()
        self._refused: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # models whose watch failed to attach
        self._strict = default_strict()

    # ---- installing ------------------------------------------------------------------------------------------
    def install(self) -> None:
        """Register the global forward and optimizer hooks and wrap `torch.autograd.backward`."""
        self._handles = [
            register_global_module_hook("forward_pre", self._guarded(self._forward_pre), owner=self, tags=_TAGS),
            register_global_module_hook(
                "forward", self._guarded(self._forward), owner=self, tags=_TAGS, always_call=True
            ),
            register_global_optimizer_hook("step_pre", self._guarded(self._step_pre), owner=self, tags=_TAGS),
            register_global_optimizer_hook("step_post", self._guarded(self._step_post), owner=self, tags=_TAGS),
        ]
        self._wrap_backward()
        self._wrap_optimizer_init()

    def _wrap_backward(self) -> None:
        """`torch.autograd.backward` (what `loss.backward()` calls), wrapped: the loss, and the models it reaches."""
        self._original_backward = original = torch.autograd.backward
        session = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            loss = session._guarded(session._before_backward)(tensors)
            try:
                result = original(tensors, *args, **kwargs)
            except BaseException:
                session._forget(loss)
                raise
            if loss is not None:
                session._guarded(session._after_backward)(loss)
            return result

        backward.__doc__, backward.__wrapped__ = original.__doc__, original  # type: ignore[attr-defined]
        torch.autograd.backward = backward

    def _wrap_optimizer_init(self) -> None:
        """`torch.optim.Optimizer.__init__`, wrapped: the optimizers the script makes, to find each model's."""
        self._original_init = original_init = torch.optim.Optimizer.__init__
        optimizers = self._optimizers

        def init(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            original_init(optimizer, *args, **kwargs)
            optimizers.add(optimizer)

        torch.optim.Optimizer.__init__ = functools.wraps(original_init)(init)  # type: ignore[method-assign,assignment]

    def remove(self) -> None:
        """Restore `torch.autograd.backward`, remove the global hooks and stop every watch (flushing what it
        recorded); leave out the models no backward reached. Safe to call twice."""
        if self._original_backward is not None:
            torch.autograd.backward = self._original_backward
            self._original_backward = None
        if self._original_init is not None:
            torch.optim.Optimizer.__init__ = self._original_init  # type: ignore[method-assign]
            self._original_init = None
        while self._handles:
            self._handles.pop().remove()
        for entry in self.watched:
            try:
                if entry.pending:  # backwarded into a step that never came (a run ended mid-accumulation)
                    values = [loss.value for loss in entry.pending]
                    self._log_loss(entry, sum(values[1:], values[0]))
                    entry.pending = []
                entry.watcher.detach()
            except Exception as err:
                self._note(f"stopping the watch on {entry.name} failed: {err}")
        untrained = [entry for entry in self.watched if not entry.reached]
        for entry in untrained:
            self._note(
                f"{entry.name} ran in training mode but no backward reached it, so it was not trained and is not "
                "reported"
            )
        self.watched = [entry for entry in self.watched if entry.reached]
        for entry in self.watched:
            if entry.optimizer is None:
                self._note(
                    f"{entry.name} was trained without a torch.optim optimizer (hand-written updates): one step is "
                    "one training forward and its backward, and there are no update ratios"
                )

    def _note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)
            print(f"hookscope: {message}", file=sys.stderr)

    def _guarded(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` whose failure becomes a note (the script goes on), or is raised when strict."""

        def run(*args: Any) -> Any:
            try:
                return fn(*args)
            except Exception as err:
                if self._strict:
                    raise
                self._note(f"an internal error was skipped ({type(err).__name__}: {' '.join(str(err).split())})")
                return None

        return run

    # ---- forwards: which models are trained ------------------------------------------------------------------
    def _forward_pre(self, module: nn.Module, args: Any) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth:
            return
        with self._lock:
            entry = self._roots.get(id(module))
            if (entry is not None and entry.model is module) or module in self._refused:
                return
            if uncounted(module) is None and any(p.requires_grad for p in module.parameters()):
                try:
                    self._watch(module, tuple(args))
                except Exception as err:  # a model hookscope refuses, or a --select it does not have
                    self._refused.add(module)
                    self._note(f"could not watch {type(module).__name__}: {' '.join(str(err).split())}")

    def _forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._local.depth = max(getattr(self._local, "depth", 1) - 1, 0)
        if getattr(self._local, "depth", 0):
            return
        entry = self._roots.get(id(module))
        if entry is None or entry.model is not module or output is None:
            return
        leaves = [t for _, t in tensor_leaves(output) if t.requires_grad]
        if leaves and uncounted(module) is None:
            reached = self._reached(entry)
            torch.autograd.graph.register_multi_grad_hook(leaves, reached, mode="any")

    def _reached(self, entry: WatchedModel) -> Callable[[Any], None]:
        def hook(grad: Any) -> None:  # a backward reached the model's output: which loss?
            task = graph_task_id()
            loss = self._backwards.get(task)
            if loss is None:  # the output is the loss itself (computed in forward): its hook runs before `started`
                self._early.setdefault(task, []).append(entry)
            elif entry not in loss.reached:
                loss.reached.append(entry)

        return hook

    def _watch(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        """Watch `module` from this forward on; its own pre-hooks are replayed for this call, which began already."""
        before = {key for key, _, _ in forward_pre_hooks(module)}
        optimizer = self._optimizer_of(module)
        watcher = watch(
            module, optimizer, every=self.every, select=self.select, capacity=self.capacity, exact=self.exact
        )
        watcher.attach()
        for key, hook, with_kwargs in forward_pre_hooks(module):
            if key not in before and not with_kwargs:
                hook(module, args)
        entry = WatchedModel(type(module).__name__, module, watcher, args)
        self.watched.append(entry)
        self._roots[id(module)] = entry
        if optimizer is not None:
            entry.optimizer = weakref.ref(optimizer)
            self._bound.setdefault(optimizer, []).append(entry)
            if optimizer in self._stepping:  # first seen inside its optimizer's step (a closure): it began already
                watcher.before_optimizer_step(optimizer)

    def _optimizer_of(self, module: nn.Module) -> torch.optim.Optimizer | None:
        """The optimizer the script made that holds most of `module`'s parameters, if any."""
        own = {id(p) for p in module.parameters()}
        best, most = None, 0
        for optimizer in list(self._optimizers):
            shared = sum(1 for group in optimizer.param_groups for p in group["params"] if id(p) in own)
            if shared > most:
                best, most = optimizer, shared
        return best

    # ---- backward: the loss and the models it reached --------------------------------------------------------
    def _before_backward(self, tensors: Any) -> _Loss | None:
        roots = [tensors] if isinstance(tensors, torch.Tensor) else [t for t in tensors if isinstance(t, torch.Tensor)]
        roots = [t for t in roots if t.grad_fn is not None]
        if not roots or not self.watched:
            return None
        loss = _Loss(sum((t.detach().float().sum() for t in roots), torch.zeros((), device=roots[0].device)))

        def started(grads: Any) -> None:
            task = graph_task_id()
            self._backwards[task] = loss
            for entry in self._early.pop(task, []):
                if entry not in loss.reached:
                    loss.reached.append(entry)

        node = roots[0].grad_fn
        if node is not None:
            node.register_prehook(started)
        return loss

    def _forget(self, loss: _Loss | None) -> None:
        """Drop the graph tasks of `loss`'s backward (it ended)."""
        for task in [task for task, value in self._backwards.items() if value is loss]:
            self._backwards.pop(task, None)
        self._early.clear()  # reached by a backward whose loss was never known (not a wrapped backward)

    def _after_backward(self, loss: _Loss) -> None:
        with self._lock:
            self._forget(loss)
            for entry in loss.reached:
                entry.reached = True
                if entry.optimizer is None:
                    self._log_loss(entry, loss.value)
                    self._stepped(entry)
                else:
                    entry.pending.append(loss)

    def _log_loss(self, entry: WatchedModel, value: torch.Tensor) -> None:
        entry.watcher.log_loss(value)
        entry.last_loss = value

    def _stepped(self, entry: WatchedModel) -> None:
        entry.steps += 1
        if self._progress is not None:
            self._progress(self.watched)

    # ---- optimizer steps -------------------------------------------------------------------------------------
    def _step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with self._lock:
            self._stepping.add(optimizer)
            entries = self._bind(optimizer, after_step=False)
            for entry in entries:
                if entry.pending:
                    values = [loss.value for loss in entry.pending]
                    self._log_loss(entry, sum(values[1:], values[0]))
                    self._consume(entry.pending)

    def _step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with self._lock:
            self._stepping.discard(optimizer)
            entries = self._bind(optimizer, after_step=True)
            for entry in entries:
                if entry.pending:  # backwarded inside the step: a closure; its first loss is the step's
                    self._log_loss(entry, entry.pending[0].value)
                    self._consume(entry.pending)
                self._stepped(entry)

    def _consume(self, losses: list[_Loss]) -> None:
        """A loss belongs to the first step that uses it: take `losses` out of every model's pending list."""
        used = {id(loss) for loss in losses}
        for entry in self.watched:
            entry.pending = [loss for loss in entry.pending if id(loss) not in used]

    def _bind(self, optimizer: torch.optim.Optimizer, after_step: bool) -> list[WatchedModel]:
        """The watched models `optimizer` updates, given it as their optimizer on its first step."""
        known = self._bound.get(optimizer)
        if known is not None:
            return known
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        entries = [
            e for e in self.watched if e.optimizer is None and any(id(p) in params for p in e.model.parameters())
        ]
        if not entries:
            if after_step:
                self._bound[optimizer] = []
                self._note(
                    f"{type(optimizer).__name__} stepped parameters of no model seen in a training forward; not watched"
                )
            return []
        for entry in entries:
            entry.watcher.attach_optimizer(optimizer, after_step=after_step)
            entry.optimizer = weakref.ref(optimizer)
        self._bound[optimizer] = entries
        return entries
