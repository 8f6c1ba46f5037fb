"""Make FlopCounterMode see every matmul of a forward: extra formulas and kernels it can count.

`FlopCounterMode` counts the ops in its registry (mm, addmm, bmm, convolution, the CUDA attention kernels).
Three CPU/CUDA paths would hide matmuls from it: the CPU flash-attention kernel (no formula in torch; we give it
torch's own SDPA formula), the fused `nn.TransformerEncoderLayer`/`nn.MultiheadAttention` fast path (one opaque
kernel, and the submodules never run), and the oneDNN/cuDNN RNN kernels. `countable_kernels` switches the last
two off for the duration of a summary and restores them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.nn as nn
from torch.utils import flop_counter

__all__ = ["EXTRA_FLOP_FORMULAS", "countable_kernels", "flop_counter_mode"]


def _extra_formulas() -> dict[Any, Any]:
    formulas: dict[Any, Any] = {}
    cpu_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_flash is not None and cpu_flash not in flop_counter.flop_registry:
        # The module-level formula is already shape-wrapped; FlopCounterMode wraps custom ones itself.
        formulas[cpu_flash] = getattr(flop_counter.sdpa_flop, "__wrapped__", flop_counter.sdpa_flop)
    return formulas


EXTRA_FLOP_FORMULAS = _extra_formulas()
"""Op -> FLOP formula for ops torch's registry misses (the CPU flash-attention kernel), shape-based like torch's."""


def flop_counter_mode() -> flop_counter.FlopCounterMode:
    """Return a silent `FlopCounterMode` with `EXTRA_FLOP_FORMULAS` added."""
    return flop_counter.FlopCounterMode(display=False, custom_mapping=EXTRA_FLOP_FORMULAS)


@contextmanager
def countable_kernels(model: nn.Module) -> Iterator[None]:
    """Run the block with the fused kernels that FlopCounterMode cannot count switched off, then restore them."""
    with ExitStack() as stack:
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        stack.callback(torch.backends.mha.set_fastpath_enabled, fastpath)
        if any(isinstance(m, nn.RNNBase) for m in model.modules()):
            backends: tuple[Any, ...] = (torch.backends.mkldnn, torch.backends.cudnn)
            for backend in backends:
                stack.callback(setattr, backend, "enabled", backend.enabled)
                backend.enabled = False
        yield
