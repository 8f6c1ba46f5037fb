"""Where the watch's hooks meet the step rule: staging per root forward, and gradient hooks that fire once.

A forward hook inside a root forward records into that forward's `Staged` area, kept by `Recorder.commit` when the
forward completes (`hookscope.callbacks._steps`). Gradient hooks are ephemeral per-call hooks on the outputs: a
pre-hook on the node that made each output, which calls the hook once; a later backward through the same graph
(`retain_graph=True`) calls `repeated()` instead, so output gradients are the first backward's and the step is
labelled. Gradients are read as real tensors (|z| for complex ones: the same norm); sparse and nested tensors are
not described.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..callbacks._steps import Frame
from ..hooks._tree import is_plain, tensor_leaves
from ._call_log import Evidence

__all__ = ["Check", "GradHook", "Staged", "hook_grads", "no_label", "plain_grad", "staged"]

GradHook = Callable[[Any], None]

Check = tuple[int, int, tuple[torch.Tensor, torch.Tensor], int | None]
"""A checked call: (0 output or 1 output gradient, module, its min and max, where in a forward it took place
(`CallLog.place`; `None`: unknown))."""


class Staged:
    """What the hooks of one root forward recorded, kept when that forward completes (`Recorder.commit`)."""

    __slots__ = ("acts", "calls", "checks", "evidence", "row")

    def __init__(self, row: int) -> None:
        self.row = row  # the row id of the step the forward began in
        self.acts: list[tuple[Any, ...]] = []  # what `RecordTable.stage` read of each output
        self.checks: list[Check] = []
        self.evidence: list[Evidence] = []  # whether the calls of shared modules output non-finite values
        self.calls = 0


def staged(frame: Frame | None, row: int) -> Staged | None:
    """The staging area of `frame` (made on first use, for row id `row`); `None` outside a root forward: record
    directly."""
    if frame is None:
        return None
    if not frame.items:
        frame.items.append(Staged(row))
    staged: Staged = frame.items[0]
    return staged


def plain_grad(grad: torch.Tensor) -> torch.Tensor | None:
    """`grad` as the real tensor whose norm is its norm (|z| for complex), `None` for sparse or nested ones."""
    if not is_plain(grad):
        return None
    return grad.abs() if grad.is_complex() else grad


def no_label(label: str) -> None:
    return None


def no_repeat() -> None:
    return None


def hook_grads(output: Any, hook: GradHook, repeated: Callable[[], None] = no_repeat) -> None:
    # Ephemeral per-call hooks on the output tensors: they die with the graph, so they bypass the registry (as
    # hookscope.hooks.register_output_grad_hook does) and work when an in-place op follows the module.
    if type(output) is torch.Tensor:
        hook_grad(output, hook, repeated)
        return
    for _, tensor in tensor_leaves(output):
        hook_grad(tensor, hook, repeated)


def hook_grad(tensor: torch.Tensor, hook: GradHook, repeated: Callable[[], None]) -> None:
    """Call `hook(grad)` with the gradient of `tensor` once: a pre-hook on the node that made it (half the cost
    of `Tensor.register_hook`, same gradient: the one w.r.t. this version of the tensor), a tensor hook for leaves
    and under `torch.compile`. A later backward through the same graph (`retain_graph=True`) calls `repeated()`
    instead."""
    if not tensor.requires_grad:
        return
    if torch.compiler.is_compiling() or tensor.grad_fn is None:
        tensor.register_hook(hook)  # type: ignore[no-untyped-call]
        return
    node = tensor.grad_fn
    slot = tensor.output_nr
    fired = [False]

    def prehook(grads: tuple[torch.Tensor | None, ...]) -> None:
        if fired[0]:
            repeated()
            return
        fired[0] = True
        hook(grads[slot])

    node.register_prehook(prehook)
