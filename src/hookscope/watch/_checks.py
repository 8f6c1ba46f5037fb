"""Unrecorded steps of a watch: only whether outputs and their gradients are finite, found on the device and
folded into the first non-finite step of each module when the step closes (`NonFiniteChecks`, part of
`Recorder`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from ..hooks import HookErrors
from ..hooks._calls import CalledHook
from ..hooks._tree import is_plain
from ._entry import GradHook, Staged, hook_grads, plain_grad
from ._inspect import first_float

__all__ = ["NonFiniteChecks"]


class NonFiniteChecks:
    """The non-finite checks of unrecorded steps, eager and traced (a part of `Recorder`)."""

    paths: list[str]
    observed: list[bool]
    checks: list[tuple[int, int, tuple[torch.Tensor, torch.Tensor]]]
    stage: torch.Tensor | None
    flags: torch.Tensor | None
    first: torch.Tensor | None
    lock: threading.RLock
    errors: HookErrors | None
    grad_where: list[str]
    drop: Callable[..., None]
    positions: Callable[[list[int], torch.device], torch.Tensor]
    _rank: Callable[[int, int], None]
    _repeated: Callable[[], None]
    _take_traced: Callable[[], list[tuple[int, int, torch.Tensor]]]
    _assume_backward_order: Callable[[], None]

    def _check(self, index: int, output: Any, staged: Staged | None) -> None:
        self.drop("sampling")
        self.observed[index] = True
        self._rank(0, index)
        x = first_float(output)
        if x is None or not x.numel() or not is_plain(x):
            return
        (self.checks if staged is None else staged.checks).append((0, index, torch.aminmax(x.detach())))
        if torch.is_grad_enabled():
            hook_grads(output, self._check_hook(index), self._repeated)

    def _check_hook(self, index: int) -> GradHook:
        def hook(grad: torch.Tensor) -> None:
            plain = plain_grad(grad)
            if plain is not None and plain.numel():
                with self.lock:
                    self._rank(1, index)
                    self.checks.append((1, index, torch.aminmax(plain)))

        return CalledHook(hook, self.errors, self.grad_where[index])

    def _traced_check_hook(self, index: int) -> GradHook:
        def hook(grad: torch.Tensor) -> None:
            if self.stage is not None:
                hit = ~torch.isfinite(torch.stack(torch.aminmax(grad))).all()
                self.stage[index, 3].add_(hit.to(self.stage.dtype))

        return hook

    def fold_flags(self, step: int) -> None:
        """Fold the checked step's non-finite findings into the first non-finite steps, on the device."""
        found: list[tuple[int, int, tuple[torch.Tensor, ...]]] = [(d, j, tuple(pair)) for d, j, pair in self.checks]
        self.checks = []
        traced = [(0, j, tuple(t.unbind())) for kind, j, t in self._take_traced() if kind == -1]
        for _, j, _ in traced:
            self.observed[j] = True
            self._rank(0, j)
        if traced:
            self._assume_backward_order()
        found += traced
        stage = self.stage if traced else None
        if not found:
            return
        device = found[0][2][0].device
        hits = torch.zeros(2 * len(self.paths), device=device)
        bad = ~torch.isfinite(torch.stack([v for _, _, pair in found for v in pair]).view(-1, 2)).all(1)
        hits.index_add_(0, self.positions([d * len(self.paths) + j for d, j, _ in found], device), bad.float())
        if stage is not None:
            hits[len(self.paths) :].add_(stage[:, 3].to(device))
            stage[:, 3].zero_()
        self._ensure_flags(device)
        if self.first is not None:
            newly = (hits.view(2, -1) > 0) & (self.first < 0)
            self.first.copy_(torch.where(newly, step, self.first))

    def _ensure_flags(self, device: torch.device) -> None:
        if self.flags is None or self.first is None:
            self.flags = torch.ones(2, len(self.paths), dtype=torch.bool, device=device)
            self.first = torch.full((2, len(self.paths)), -1, dtype=torch.int64, device=device)
