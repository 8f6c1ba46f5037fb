"""Run one forward with recording hooks: per-call shapes, bytes and FLOPs; the model is left as it was found.

`run_forward` places a forward-pre hook (prepended) and a forward hook (prepended, so it runs right after torch's
global hooks, where FlopCounterMode's module tracker closes a module) on every module, runs the model once under
`torch.no_grad()` and returns one `CallRecord` per module call. FLOPs of a call are the change of
FlopCounterMode's running total between its two hooks, so they include the calls it makes (inclusive) and the sum
of `self_flops` over all calls equals the total. The train/eval mode of every module, buffers (BatchNorm running
statistics in train mode) and the RNG state (dropout, lazy modules) are restored and the hooks removed, also when
forward fails; then the error names the module that was running.

TorchScript modules take no module hooks; torch's global module hooks still fire when eager code calls one, so
those calls are recorded through a global hook that looks only at them (what runs inside a scripted module is
not seen). With a `SavedTensors`, forward runs with gradients enabled and records what autograd saves.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from .._progress import ProgressLine
from ..hooks import register_global_module_hook, register_module_hook
from ..hooks._registry import scope
from ._flops import countable_kernels, flop_counter_mode
from ._memory import SavedTensors
from ._shapes import describe, describe_call, tensor_bytes

__all__ = ["MODES", "CallRecord", "ForwardRun", "has_forward", "restored_modes", "run_forward"]

MODES = ("eval", "train", "same")


@dataclass
class CallRecord:
    """One call of one module during the recorded forward."""

    module_id: int
    path: str
    parent: int | None
    input_shape: Any
    output_shape: Any = None
    output_bytes: int = 0
    flops: int = 0
    child_flops: int = 0
    done: bool = False
    start_flops: int = field(default=0, repr=False)

    @property
    def self_flops(self) -> int:
        """FLOPs of this call minus those of the module calls it made."""
        return self.flops - self.child_flops


@dataclass
class ForwardRun:
    """What one recorded forward gave: the output, the calls in start order, and the total FLOPs."""

    output: Any
    calls: list[CallRecord]
    total_flops: int


class _Recorder:
    """Forward hooks that keep a call stack; holds module ids and paths, never the modules."""

    def __init__(self, paths: dict[int, str], counter: Any, scripted: set[int], line: ProgressLine) -> None:
        self.paths = paths
        self.counter = counter
        self.scripted = scripted
        self.line = line
        self.calls: list[CallRecord] = []
        self.stack: list[int] = []
        self.finished: set[int] = set()  # ids of the modules whose forward completed at least once

    def _flops(self) -> int:
        return int(self.counter.get_total_flops()) if self.counter is not None else 0

    def pre(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        parent = self.stack[-1] if self.stack else None
        record = CallRecord(id(module), self.paths[id(module)], parent, describe_call(args, kwargs))
        record.start_flops = self._flops()
        self.stack.append(len(self.calls))
        self.calls.append(record)

    def post(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        index = next((i for i in reversed(self.stack) if self.calls[i].module_id == id(module)), None)
        if index is None:  # pragma: no cover - a hook of ours always saw the pre hook first
            return
        del self.stack[self.stack.index(index) :]
        record = self.calls[index]
        record.output_shape, record.output_bytes, record.done = describe(output), tensor_bytes(output), True
        record.flops = self._flops() - record.start_flops
        if record.parent is not None:
            self.calls[record.parent].child_flops += record.flops
        if record.module_id not in self.finished:
            self.finished.add(record.module_id)
            self.line.advance()

    def global_pre(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if id(module) in self.scripted:
            self.pre(module, args, {})

    def global_post(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if id(module) in self.scripted:
            self.post(module, args, output)

    def failure(self, model: nn.Module, err: BaseException) -> str:
        running = [self.calls[i] for i in self.stack]
        done = [c for c in self.calls if c.done]
        where = f"in module {_name(running[-1])}" if running else "outside any submodule"
        last = f"; the last module that completed was {_name(done[-1])}" if done else "; no module completed"
        return (
            f"forward of {type(model).__name__} failed {where}{last}. The model's train/eval mode and hooks"
            f" were restored. Cause: {type(err).__name__}: {err}"
        )


def _name(record: CallRecord) -> str:
    return repr(record.path) if record.path else "'' (the root)"


def run_forward(
    model: nn.Module,
    paths: dict[int, str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    mode: str = "eval",
    count_flops: bool = True,
    saved: SavedTensors | None = None,
    progress: bool | None = False,
) -> ForwardRun:
    """Run `model(*args, **kwargs)` once, recording every call of the modules whose ids are keys of `paths`.

    Without gradients, unless `saved` is given: then with gradients, `saved` counting what autograd keeps. With
    `progress` (as `ProgressLine`'s `enabled`), the modules whose forward completed are counted on a progress
    line, out of those that have a forward (containers such as `nn.ModuleList` never run); a module that is
    never called leaves the count short of the total, and the line is cleared when the forward ends.

    Raises:
        ValueError: `mode` is not one of `MODES`.
        RuntimeError: forward raised; the message names the module that was running and the last one that
            completed, and the original error is chained.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    counter = flop_counter_mode() if count_flops else None
    modules = {id(m): m for m in model.modules() if id(m) in paths}
    scripted = {key for key, m in modules.items() if isinstance(m, torch.jit.ScriptModule)}
    runnable = sum(1 for m in modules.values() if has_forward(m))
    # __enter__ -> run_forward -> summary -> @checked -> the caller
    line = ProgressLine("summary", runnable, "modules", enabled=progress, stacklevel=5)
    recorder = _Recorder(paths, counter, scripted, line)
    with restored_modes(model, keep_buffers=mode != "eval"), scope(), line, ExitStack() as stack:
        _register(recorder, [m for key, m in modules.items() if key not in scripted])
        if mode != "same":
            model.train(mode == "train")
        stack.enter_context(torch.no_grad() if saved is None else torch.enable_grad())
        if saved is not None:
            stack.enter_context(saved.recording())
        stack.enter_context(countable_kernels(model))
        if counter is not None:
            stack.enter_context(counter)
        try:
            output = model(*args, **kwargs)
        except Exception as err:
            raise RuntimeError(recorder.failure(model, err)) from err
    total = counter.get_total_flops() if counter is not None else 0
    return ForwardRun(output, recorder.calls, int(total))


def has_forward(module: nn.Module) -> bool:
    """Whether `module` has a forward of its own (a TorchScript module has; a container such as `nn.ModuleList`
    has not)."""
    return isinstance(module, torch.jit.ScriptModule) or type(module).forward is not nn.Module.forward


def _register(recorder: _Recorder, eager: list[nn.Module]) -> None:
    for module in eager:
        register_module_hook(module, "forward_pre", recorder.pre, owner="summary", prepend=True, with_kwargs=True)
        register_module_hook(module, "forward", recorder.post, owner="summary", prepend=True)
    if recorder.scripted:  # global hooks are the only ones torch runs for a ScriptModule called from eager code
        register_global_module_hook("forward_pre", recorder.global_pre, owner="summary")
        register_global_module_hook("forward", recorder.global_post, owner="summary")


@contextmanager
def restored_modes(model: nn.Module, keep_buffers: bool = False) -> Iterator[None]:
    """Restore every module's train/eval mode and the RNG state on exit (and the buffers with `keep_buffers`)."""
    modes = [(m, m.training) for m in model.modules()]
    saved = _buffers(model) if keep_buffers else []
    tensors = [*model.parameters(), *model.buffers()]
    devices = sorted({t.get_device() for t in tensors if t.is_cuda})
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        for module, training in modes:
            module.training = training
        with torch.no_grad():
            for module, name, buffer, value in saved:
                setattr(module, name, buffer)
                if buffer is not None and value is not None:
                    buffer.copy_(value)


def _buffers(model: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor | None, torch.Tensor | None]]:
    saved: list[tuple[nn.Module, str, torch.Tensor | None, torch.Tensor | None]] = []
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            saved.append((module, name, buffer, None if buffer is None else buffer.detach().clone()))
    return saved
