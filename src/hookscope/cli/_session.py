"""`hookscope run`'s watcher: finds each model a script trains through global hooks and watches it.

A module called in training mode at the top of a forward (no other forward running) that has parameters is a
candidate model. At the first step of each optimizer, the candidate holding most of the optimizer's parameters
is watched (`watch(model, optimizer)`) from the next forward on, so every watched step is whole. A loss computed
by a `torch.nn` loss module with a gradient is logged to the model that ran last. Nothing here may break the
script: a failure inside these hooks is kept as a note for the report and printed once.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from ..hooks import HookHandle, register_global_module_hook, register_global_optimizer_hook
from ..watch import Watch, watch

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


@dataclass
class _Candidate:
    model: weakref.ref[nn.Module]
    first_args: tuple[Any, ...]


@dataclass
class RunSession:
    """Watch every model a script trains with an optimizer; `install()` the hooks, `remove()` them after."""

    every: int = 1
    select: str | None = None
    watched: list[WatchedModel] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _candidates: dict[int, _Candidate] = field(default_factory=dict)
    _roots: dict[int, WatchedModel] = field(default_factory=dict)
    _optimizers: weakref.WeakSet[torch.optim.Optimizer] = field(default_factory=weakref.WeakSet)
    _handles: list[HookHandle] = field(default_factory=list)
    _depth: int = 0
    _last: WatchedModel | None = None

    def install(self) -> None:
        """Register the global forward-pre, forward and optimizer step-post hooks."""
        self._handles = [
            register_global_module_hook("forward_pre", self._forward_pre, owner=self, tags=_TAGS),
            register_global_module_hook("forward", self._forward, owner=self, tags=_TAGS),
            register_global_optimizer_hook("step_post", self._step_post, owner=self, tags=_TAGS),
        ]

    def remove(self) -> None:
        """Remove the global hooks and stop every watch (flushing what it recorded); safe to call twice."""
        while self._handles:
            self._handles.pop().remove()
        for entry in self.watched:
            try:
                entry.watcher.detach()
            except Exception as err:
                self._note(f"stopping the watch on {entry.name} failed: {err}")

    def _note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)
            print(f"hookscope: {message}", file=sys.stderr)

    def _forward_pre(self, module: nn.Module, args: Any) -> None:
        depth, self._depth = self._depth, self._depth + 1
        if depth:
            return
        key = id(module)
        entry = self._roots.get(key)
        if entry is not None and entry.model is module:
            self._last = entry
        elif module.training and not self._is_candidate(key, module) and any(True for _ in module.parameters()):
            self._candidates[key] = _Candidate(weakref.ref(module), tuple(args))

    def _is_candidate(self, key: int, module: nn.Module) -> bool:
        candidate = self._candidates.get(key)
        return candidate is not None and candidate.model() is module  # ids of dead models are reused

    def _forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth = max(self._depth - 1, 0)
        if (
            self._last is not None
            and isinstance(module, nn.modules.loss._Loss)
            and isinstance(output, torch.Tensor)
            and output.ndim == 0
            and output.requires_grad
        ):
            self._last.watcher.log_loss(output.detach())

    def _step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._depth = 0  # no forward runs between steps: a forward that raised earlier leaves no stale depth
        if optimizer in self._optimizers:
            return
        self._optimizers.add(optimizer)
        try:
            self._watch(optimizer)
        except Exception as err:
            self._note(f"could not watch the model trained by {type(optimizer).__name__}: {' '.join(str(err).split())}")

    def _watch(self, optimizer: torch.optim.Optimizer) -> None:
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        best, overlap = None, 0
        for key, candidate in list(self._candidates.items()):
            model = candidate.model()
            if model is None:
                del self._candidates[key]
                continue
            shared = sum(1 for p in model.parameters() if id(p) in params)
            if shared > overlap:
                best, overlap = key, shared
        if best is None:
            self._note(
                f"{type(optimizer).__name__} stepped parameters of no model seen in a training forward; not watched"
            )
            return
        candidate = self._candidates.pop(best)
        model = candidate.model()
        if model is None:
            return
        watcher = watch(model, optimizer, every=self.every, select=self.select)
        watcher.attach()
        entry = WatchedModel(type(model).__name__, model, watcher, candidate.first_args)
        self.watched.append(entry)
        self._roots[best] = entry
        self._last = entry
