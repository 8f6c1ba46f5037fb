"""The residual stream in `watch()`: the output of each repeated block, on recorded steps.

Repeated blocks are the children of a `ModuleList` or `Sequential` whose children are all of one class with
submodules of their own (`transformer.h.N`, `model.layers.N`, `encoder.layer.N`, `blocks.N`, a ResNet stage's
blocks). A forward hook on each describes its first floating-point output of 3 or more dims
(`hookscope.stats.describe_residual`: the largest magnitude, its channel (the last dim) and token, the median
magnitude) into the open recorded step's row of a device table; several calls in one step keep the largest.
Nothing is read back to the host.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.nn as nn

from ..callbacks._steps import ForwardFrames, uncounted
from ..hooks import HookHandle, register_module_hook
from ..hooks._calls import HookErrors
from ..hooks._tree import first_float
from ..stats._attention import describe_residual
from ._step import StepState

__all__ = ["ResidualRecorder", "ResidualTable", "repeated_blocks"]

_TAGS = ("watch", "residual")


def repeated_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The repeated blocks of `model`, with their paths, in model order (the outermost lists only)."""
    found: list[tuple[str, nn.Module]] = []
    inside: list[str] = []
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList | nn.Sequential) or any(path.startswith(p) for p in inside):
            continue
        children = list(module.named_children())
        kinds = {type(child) for _, child in children}
        if len(children) >= 2 and len(kinds) == 1 and all(next(c.children(), None) is not None for _, c in children):
            prefix = f"{path}." if path else ""
            found += [(prefix + name, child) for name, child in children]
            inside.append(prefix)
    return found


class ResidualTable:
    """Device rows of the blocks' residual statistics: (rows, blocks, 4) max, channel, token, median.

    Rows are addressed by the row ids of `StepBuffers` (`slot = row_id % rows`) and emptied (NaN) when taken.
    """

    def __init__(self, rows: int, blocks: int) -> None:
        self.rows, self.blocks = rows, blocks
        self.table: torch.Tensor | None = None

    def add(self, row_id: int, index: int, values: torch.Tensor) -> None:
        """Keep `values` for block `index` in row `row_id` unless the row holds a larger magnitude already."""
        if self.table is None or self.table.device != values.device:
            self.table = torch.full((self.rows, self.blocks, 4), float("nan"), device=values.device)
        cell = self.table[row_id % self.rows, index]
        larger = ~(cell[0] >= values[0])  # NaN (empty) or smaller: the new call's values
        cell.copy_(torch.where(larger, values, cell))

    def take(self, slots: list[int]) -> torch.Tensor:
        """Rows `slots` on the CPU, (len(slots), blocks, 4) float64, NaN where nothing was seen; emptied."""
        if self.table is None:
            return torch.full((len(slots), self.blocks, 4), float("nan"), dtype=torch.float64)
        index = torch.tensor(slots, device=self.table.device)
        taken = self.table.index_select(0, index).double().cpu()
        self.table.index_fill_(0, index, float("nan"))
        return taken


class ResidualRecorder:
    """Forward hooks on the repeated blocks; their outputs' statistics go into `table` rows.

    Args:
        blocks: The blocks, with their paths (`repeated_blocks`).
        table: Where the statistics go (the recorder's `StepBuffers.residual`).
        state: The watch's step state (read: which row is open).
        train_only: As `watch(train_only=)`.
    """

    def __init__(
        self, blocks: list[tuple[str, nn.Module]], table: ResidualTable, state: StepState, train_only: bool
    ) -> None:
        self.paths = [path for path, _ in blocks]
        self.token_dims = [0 if _sequence_first(block) else -2 for _, block in blocks]
        self.state = state
        self.train_only = train_only
        self.table = table
        self.lock: threading.RLock = threading.RLock()
        self.errors: HookErrors | None = None
        self.frames: ForwardFrames | None = None
        self._blocks = blocks
        self._handles: list[HookHandle] = []

    def register(self) -> None:
        """Place one forward hook on every block."""
        for index, (path, block) in enumerate(self._blocks):
            hook = self._hook(index)
            self._handles.append(
                register_module_hook(block, "forward", hook, owner=self, path=path, tags=_TAGS, errors=self.errors)
            )

    def remove(self) -> None:
        """Remove the hooks and let go of the blocks; calling it again does nothing."""
        while self._handles:
            self._handles.pop().remove()
        self._blocks = []

    def pausable(self) -> list[HookHandle]:
        """The hooks that may pause between measured steps (all of them)."""
        return list(self._handles)

    def _hook(self, index: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if torch.compiler.is_compiling() or self.state.row < 0:
                return
            frame = self.frames.current() if self.frames is not None else None
            if (uncounted(module, self.train_only) if frame is None else frame.reason) is not None:
                return
            x = first_float(output)
            if x is None or x.dim() < 3 or x.numel() == 0:
                return
            with self.lock, torch.no_grad():
                self.table.add(self.state.row, index, describe_residual(x, self.token_dims[index]))

        return hook

    def bind(self, blocks: list[tuple[str, nn.Module]]) -> None:
        """Watch `blocks` (a new fit of the same model: the same paths)."""
        self._blocks = blocks


def _sequence_first(block: nn.Module) -> bool:
    """Whether the block's outputs put the sequence first (`nn.Transformer*Layer` with `batch_first=False`)."""
    layers = nn.TransformerEncoderLayer | nn.TransformerDecoderLayer
    return isinstance(block, layers) and not block.self_attn.batch_first
