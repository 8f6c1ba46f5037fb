"""Attention, per head, in `watch()`: where the attention logits are formed, and what they look like.

Attention is found where it is computed, whatever the model: calls of `F.scaled_dot_product_attention` (nanoGPT's
fast path, Hugging Face `sdpa`, `nn.MultiheadAttention` and `nn.Transformer*Layer` in training) and softmaxes
over the last dim of a 4-D tensor (batch, heads, queries, keys), or of a 3-D one inside an
`nn.MultiheadAttention` (its explicit path), made with `F.softmax`, `torch.softmax` or `Tensor.softmax` (Hugging
Face `eager`, nanoGPT's slow path, hand-written modules). While a training forward of a recorded step runs, and
only then, these four functions are wrapped (`_Interception`: installed by the root's forward pre-hook, restored
by its always-called forward hook, even when the forward raises; other threads' calls pass through untouched):
each call runs as it is, its result goes back unchanged, and its inputs are described on the device
(`hookscope.stats.describe_attention`) into the open step's row of an `AttentionTable`, under the path of the
innermost module running. The first recorded training forward finds the attention modules (hooks on every module
that may compute one); from then on only those keep hooks (to name the module), and a model without attention
keeps none. Measured: every recorded step
(`every`), at most `hookscope.stats.ATTENTION_VALUES` logits per call (the `sampled` statistic says how many
queries were left out). Nothing is read back to the host. Not measured under `torch.compile` (the compiled graph
calls the attention functions without Python, and wrapping them inside a graph would break it): each training
forward of a recorded step that runs compiled is counted in `dropped["attention_compiled"]` instead, and warned
about once (`CompiledModelWarning`), by a function the compiled graph calls eagerly before it runs; only for models
that look like they compute attention (a module type named `...Attention`, `...Attn` or `Transformer...`).
"""

from __future__ import annotations

import math
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._errors import CompiledModelWarning
from ..callbacks._steps import ForwardFrames, uncounted
from ..hooks import HookHandle, normalize_path, register_module_hook
from ..hooks._calls import HookErrors, user_stacklevel
from ..stats._attention import ATTENTION_FIELDS, attention_scores, attention_slice, describe_attention, finish_attention
from ._step import StepState

__all__ = ["AttentionRecorder", "AttentionTable", "RowIds"]


class RowIds(Protocol):
    """What tells whether a row id is still on the device (`StepBuffers.is_live`)."""

    def is_live(self, row_id: int) -> bool:
        """Whether row `row_id` is still in the buffers (not taken)."""


_TAGS = ("watch", "attention")


class AttentionTable:
    """Device rows of per-head attention accumulators (`ATTENTION_FIELDS`), one table per attention module.

    Rows are addressed by the row ids of `StepBuffers` (`slot = row_id % rows`) and emptied when taken.

    Args:
        rows: The number of rows (the watch's `buffer_steps`).
    """

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.tables: dict[str, torch.Tensor] = {}  # path -> (rows, heads, len(ATTENTION_FIELDS)) float32

    def add(self, row_id: int, path: str, fields: torch.Tensor) -> None:
        """Add one call's accumulators `fields` (heads, len(ATTENTION_FIELDS)) to `path`'s row `row_id`."""
        table = self.tables.get(path)
        if table is None or table.shape[1] != fields.shape[0] or table.device != fields.device:
            table = self.tables[path] = _empty(self.rows, fields.shape[0], fields.device)
        row = table[row_id % self.rows]
        torch.maximum(row[:, 0], fields[:, 0], out=row[:, 0])
        row[:, 1:] += fields[:, 1:]

    def take(self, slots: list[int]) -> dict[str, torch.Tensor]:
        """The statistics of rows `slots` on the CPU: path -> (len(slots), heads, 4) float64 (max_logit, entropy,
        sink, sampled), NaN where nothing was measured; the rows are emptied."""
        taken = {}
        for path, table in self.tables.items():
            index = torch.tensor(slots, device=table.device)
            taken[path] = finish_attention(table.index_select(0, index).cpu())
            table.index_copy_(0, index, _empty(len(slots), table.shape[1], table.device))
        return taken


def _empty(rows: int, heads: int, device: torch.device) -> torch.Tensor:
    table = torch.zeros(rows, heads, len(ATTENTION_FIELDS), device=device)
    table[..., 0] = -math.inf
    return table


class _Interception:
    """The four wrapped functions, installed process-wide while at least one measured forward runs (counted),
    and the thread-local observer each wrapper reports to (`None`: the call passes through)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.local = threading.local()
        self.users = 0
        self.originals: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original, wrapper)

    def install(self, observer: Callable[[str, tuple[Any, ...], dict[str, Any], Any], None]) -> None:
        """Wrap the functions (if not yet) and send this thread's calls to `observer` until `uninstall` (a watch
        of a model run inside another watched model's forward observes while its own forward runs)."""
        self.local.observers = [*getattr(self.local, "observers", []), observer]
        with self.lock:
            self.users += 1
            if self.users == 1:
                self.originals = [self._wrap(owner, name, kind) for owner, name, kind in _TARGETS]

    def uninstall(self) -> None:
        """Stop observing this thread's calls; restore the functions when no measured forward runs any more."""
        self.local.observers = getattr(self.local, "observers", [])[:-1]
        with self.lock:
            self.users = max(self.users - 1, 0)
            if self.users == 0:
                for owner, name, original, wrapper in reversed(self.originals):
                    if getattr(owner, name, None) is wrapper:  # another library wrapped it since: leave it
                        setattr(owner, name, original)
                self.originals = []

    def _wrap(self, owner: Any, name: str, kind: str) -> tuple[Any, str, Any, Any]:
        original = getattr(owner, name)
        local = self.local

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            observers = getattr(local, "observers", None)
            if not observers or getattr(local, "busy", False):
                return original(*args, **kwargs)
            observer = observers[-1]
            local.busy = True  # F.softmax calls Tensor.softmax, the observer softmaxes: one call observed once
            try:
                output = original(*args, **kwargs)
                observer(kind, args, kwargs, output)
            finally:
                local.busy = False
            return output

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper.__name__ = getattr(original, "__name__", name)
        wrapper.__doc__ = getattr(original, "__doc__", None)
        setattr(owner, name, wrapper)
        return owner, name, original, wrapper


_TARGETS = (
    (F, "scaled_dot_product_attention", "sdpa"),
    (F, "softmax", "softmax"),
    (torch, "softmax", "softmax"),
    (torch.Tensor, "softmax", "softmax"),
)
_INTERCEPTION = _Interception()


class AttentionRecorder:
    """Find the attention of a model and describe it, per head, into the open recorded step's row.

    Args:
        table: Where the statistics go (the recorder's `StepBuffers.attention`).
        rows: The recorder's `StepBuffers` (read: whether a row is still on the device).
        state: The watch's step state (read: which row is open).
        train_only: As `watch(train_only=)`.
        drop: Counts observations not kept, by reason (the recorder's `drop`): here the recorded training
            forwards that ran compiled, `"attention_compiled"`.
    """

    def __init__(
        self,
        table: AttentionTable,
        rows: RowIds,
        state: StepState,
        train_only: bool,
        drop: Callable[[str], None],
    ) -> None:
        self.table = table
        self.table_rows = rows
        self.state = state
        self.train_only = train_only
        self.drop = drop
        self.is_warned_compiled = False
        self.may_attend = False  # whether a module of the model is named like attention (`_may_attend`)
        # called only while torch.compile traces the root's hook: the disabled function runs as is, outside the graph
        self._compiled_forward = torch.compiler.disable(self._count_compiled)  # type: ignore[no-untyped-call]
        self.found: dict[str, weakref.ref[nn.Module]] = {}  # the attention modules, in the order first seen
        self.is_discovered = False
        self.lock: threading.RLock = threading.RLock()
        self.errors: HookErrors | None = None
        self.frames: ForwardFrames | None = None
        self._local = threading.local()  # this thread's stack of running modules, and whether it measures
        self._handles: list[HookHandle] = []
        self._candidates: dict[str, tuple[HookHandle, HookHandle]] = {}  # path -> its two naming hooks

    # ---- hooks -------------------------------------------------------------------------------------------------
    def register(self, model: nn.Module) -> None:
        """Place the root's hooks, and hooks naming the modules (every candidate until attention is found)."""
        self.may_attend = _may_attend(model)
        self._handles.append(self._hook(model, "", "forward_pre", self._root_enter))
        self._handles.append(self._hook(model, "", "forward", self._root_leave, always_call=True))
        paths = self.found if self.is_discovered else dict(_candidates(model))
        for path, module in model.named_modules():
            if normalize_path(path) in paths and module is not model:
                self._name(normalize_path(path), module)

    def remove(self) -> None:
        """Remove every hook; calling it again does nothing."""
        while self._handles:
            self._handles.pop().remove()
        for pair in self._candidates.values():
            for handle in pair:
                handle.remove()
        self._candidates.clear()

    def pausable(self, root: bool = False) -> list[HookHandle]:
        """The hooks that may pause between measured steps: those naming the modules, and with `root` the root's
        (only when they are placed back outside a forward of the root: a forward pre-hook placed back while the
        root's own pre-hooks run would miss that forward)."""
        named = [handle for pair in self._candidates.values() for handle in pair]
        return [*self._handles, *named] if root else named

    def _hook(self, module: nn.Module, path: str, kind: str, hook: Callable[..., None], **extra: Any) -> HookHandle:
        return register_module_hook(module, kind, hook, owner=self, path=path, tags=_TAGS, errors=self.errors, **extra)

    def _name(self, path: str, module: nn.Module) -> None:
        """Hooks that keep `path` on this thread's stack of running modules while `module` runs."""
        ref = weakref.ref(module)

        def enter(module: nn.Module, args: Any) -> None:
            if getattr(self._local, "measuring", False) and not torch.compiler.is_compiling():
                self._local.stack.append((path, ref))

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            stack = getattr(self._local, "stack", None)
            if stack and stack[-1][0] == path and getattr(self._local, "measuring", False):
                stack.pop()

        first = self._hook(module, path, "forward_pre", enter)
        second = self._hook(module, path, "forward", leave, always_call=True)
        self._candidates[path] = (first, second)

    def _root_enter(self, module: nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling():
            if self.may_attend:
                self._compiled_forward(module)
            return
        if self.is_discovered and not self.found:  # the first measured forward computed no attention
            return
        if getattr(self._local, "measuring", False) or not self._is_measured(module):
            return
        self._local.stack = [("", weakref.ref(module))]
        self._local.staged = []  # (path, module, fields), kept only if the forward completes
        self._local.row = self.state.row
        self._local.measuring = True
        _INTERCEPTION.install(self._observe)

    def _root_leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if not getattr(self._local, "measuring", False) or torch.compiler.is_compiling():
            return
        self._local.measuring = False
        self._local.stack = []
        _INTERCEPTION.uninstall()
        staged, self._local.staged = self._local.staged, []
        if output is None and sys.exc_info()[1] is not None:  # the forward raised: it was no training batch
            return
        with self.lock:
            row = self._local.row
            for path, ref, fields in staged:
                if path not in self.found and ref is not None and ref() is not None:
                    self.found[path] = ref
                if self.table_rows.is_live(row):
                    self.table.add(row, path, fields)
            if not self.is_discovered:
                self._settle_discovery()

    def _count_compiled(self, module: nn.Module) -> None:
        """A root forward runs compiled (called eagerly, before its graph runs): if it is a training forward of a
        recorded step, count its attention as not measured, and warn the first time."""
        if getattr(self._local, "measuring", False) or not self._is_measured(module):
            return
        with self.lock:
            self.drop("attention_compiled")
            if self.is_warned_compiled:
                return
            self.is_warned_compiled = True
        warnings.warn(
            "watch(): attention is not measured in forwards run under torch.compile (the compiled graph calls "
            "softmax and scaled_dot_product_attention without Python): results().attention gets nothing from "
            "them, and each such recorded forward is counted in results().dropped['attention_compiled']. To "
            "measure attention, run some training steps without torch.compile (e.g. a short eager run first).",
            CompiledModelWarning,
            stacklevel=user_stacklevel(),
        )

    def _settle_discovery(self) -> None:
        """The first measured forward completed: keep the hooks naming the attention modules only."""
        self.is_discovered = True
        for path in [p for p in self._candidates if p not in self.found]:
            for handle in self._candidates.pop(path):
                handle.remove()
        if not self.found:  # no attention: the root's hooks have nothing to do either
            while self._handles:
                self._handles.pop().remove()

    def _is_measured(self, module: nn.Module) -> bool:
        """Whether the root forward starting now is a training forward of a recorded step."""
        if self.state.row < 0:
            return False
        frame = self.frames.current() if self.frames is not None else None
        reason = uncounted(module, self.train_only) if frame is None else frame.reason
        return reason is None

    # ---- observing ---------------------------------------------------------------------------------------------
    def _observe(self, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        stack = getattr(self._local, "stack", None)
        path, ref = stack[-1] if stack else ("", None)
        try:
            with torch.no_grad():
                module = ref() if ref is not None else None
                fields = _sdpa(args, kwargs) if kind == "sdpa" else _softmax(args, kwargs, output, module)
            if fields is not None:
                self._local.staged.append((path, ref, fields))
        except Exception as err:
            if self.errors is None:
                raise
            self.errors.failed(err, f"attention statistics of {path!r}")

    # ---- state -------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The attention modules found (their paths)."""
        return {"attention_paths": list(self.found)}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Nothing to restore: the attention modules are found again by the first measured forward (a resumed
        run keeps the saved steps' series under their paths)."""


def _may_attend(model: nn.Module) -> bool:
    """Whether `model` looks like it computes attention: a module whose type name says so (`...Attention`,
    `...Attn`, `nn.MultiheadAttention`, `nn.Transformer*`). Only compiled forwards, which cannot be looked into,
    are judged by it."""
    names = (type(module).__name__.lower() for module in model.modules())
    return any("attention" in name or "attn" in name or name.startswith("transformer") for name in names)


def _candidates(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules that may compute attention: those with children, and leaves not from `torch.nn`."""
    return [
        (normalize_path(path), module)
        for path, module in model.named_modules()
        if next(module.children(), None) is not None or not type(module).__module__.startswith("torch.nn")
    ]


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str, default: Any = None) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def _sdpa(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The accumulators of one `scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
    scale, enable_gqa)` call, or `None` for shapes it cannot split into heads."""
    query, key = _argument(args, kwargs, 0, "query"), _argument(args, kwargs, 1, "key")
    mask = _argument(args, kwargs, 3, "attn_mask")
    is_causal, scale = bool(_argument(args, kwargs, 5, "is_causal", False)), _argument(args, kwargs, 6, "scale")
    if not isinstance(query, torch.Tensor) or not isinstance(key, torch.Tensor) or query.dim() not in (3, 4):
        return None
    if query.dim() == 3:  # one head
        query, key = query[:, None], key[:, None]
        mask = mask[:, None] if isinstance(mask, torch.Tensor) and mask.dim() == 3 else mask
    batch, heads, length = query.shape[0], query.shape[1], query.shape[2]
    rows, stride = attention_slice(batch, heads, length, key.shape[-2])
    index = torch.arange(0, length, stride, device=query.device) if stride > 1 else None
    query, key = query[:rows, :, ::stride], key[:rows]
    if isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[0] == batch:
        mask = mask[:rows]
    scores = attention_scores(query, key, mask if isinstance(mask, torch.Tensor) else None, is_causal, scale, index)
    left_out = batch * length - rows * query.shape[2]
    return describe_attention(scores, torch.softmax(scores, dim=-1), left_out)


def _softmax(
    args: tuple[Any, ...], kwargs: dict[str, Any], output: Any, module: nn.Module | None
) -> torch.Tensor | None:
    """The accumulators of a softmax that computes attention weights, or `None` for any other softmax."""
    scores, dim = _argument(args, kwargs, 0, "input"), _argument(args, kwargs, 1, "dim")
    if not isinstance(scores, torch.Tensor) or not isinstance(output, torch.Tensor) or not scores.is_floating_point():
        return None
    if dim is None or dim not in (-1, scores.dim() - 1):
        return None
    if scores.dim() == 3 and isinstance(module, nn.MultiheadAttention):  # its explicit path: (B * heads, L, S)
        heads = module.num_heads
        scores, output = (t.reshape(-1, heads, *t.shape[1:]) for t in (scores, output))
    if scores.dim() != 4:
        return None
    batch, heads, length, keys = scores.shape
    rows, stride = attention_slice(batch, heads, length, keys)
    scores, probs = scores[:rows, :, ::stride], output[:rows, :, ::stride]
    return describe_attention(scores, probs, batch * length - rows * scores.shape[2])
