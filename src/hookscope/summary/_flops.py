"""Make FlopCounterMode see every matmul of a forward, and count normalizations and activations too.

`FlopCounterMode` counts the ops in its registry (mm, addmm, bmm, convolution, the CUDA attention kernels).
Three CPU/CUDA paths would hide matmuls from it: the CPU flash-attention kernel (no formula in torch; we give it
torch's own SDPA formula), the fused `nn.TransformerEncoderLayer`/`nn.MultiheadAttention` fast path (one opaque
kernel, and the submodules never run), and the oneDNN/cuDNN RNN kernels. `countable_kernels` switches the last
two off for the duration of a summary and restores them.

Normalizations (batch, layer, group, instance norm) count 2 FLOPs per output element (normalize and scale, as
the folded `a * x + b`), activations and softmax 1 per element; `COUNTED_OPS` says so in the summary's header.
Other elementwise arithmetic (residual adds, scaling, an RMSNorm that torch decomposes into such ops), pooling
and embedding lookups are not counted, as in torch's own counter.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.nn as nn
from torch.utils import flop_counter

from .._torch import aten_ops

__all__ = ["COUNTED_OPS", "EXTRA_FLOP_FORMULAS", "countable_kernels", "flop_counter_mode"]

COUNTED_OPS = (
    "FLOPs count only matmuls, convs, attention (2 per MAC), normalizations (2/element), activations, softmax "
    "(1/element)"
)
"""What the FLOPs of a summary include, as its header says (not counted: other elementwise arithmetic such as
residual adds and scaling, pooling, embedding lookups)."""

_NORMALIZATIONS = (
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit_functional", "_batch_norm_with_update", "_batch_norm_no_update",
    "cudnn_batch_norm", "miopen_batch_norm", "native_layer_norm", "native_group_norm", "_fused_rms_norm",
)  # fmt: skip
_ACTIVATIONS = (
    "relu", "relu_", "relu6", "leaky_relu", "leaky_relu_", "_prelu_kernel", "rrelu_with_noise", "gelu", "gelu_",
    "silu", "silu_", "mish", "mish_", "sigmoid", "sigmoid_", "tanh", "tanh_", "elu", "elu_", "celu", "selu",
    "hardtanh", "hardtanh_", "hardswish", "hardswish_", "hardsigmoid", "hardsigmoid_", "softplus", "softshrink",
    "hardshrink", "threshold", "threshold_", "log_sigmoid_forward", "glu", "_softmax", "_log_softmax",
)  # fmt: skip


def _first_shape(shape: Any) -> Any:
    """The shape of an op's (first) output: `native_batch_norm` returns (output, mean, invstd)."""
    while isinstance(shape, (tuple, list)) and not isinstance(shape, torch.Size):
        shape = shape[0]
    return shape


def _per_element(flops: int) -> Any:
    def formula(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return flops * int(math.prod(_first_shape(out_shape)))

    return formula


def _extra_formulas() -> dict[Any, Any]:
    formulas: dict[Any, Any] = {}
    for cpu_flash in aten_ops(("_scaled_dot_product_flash_attention_for_cpu",), "FLOPs"):
        if cpu_flash in flop_counter.flop_registry:
            continue
        # The module-level formula is already shape-wrapped; FlopCounterMode wraps custom ones itself.
        formulas[cpu_flash] = getattr(flop_counter.sdpa_flop, "__wrapped__", flop_counter.sdpa_flop)
    for names, flops in ((_NORMALIZATIONS, 2), (_ACTIVATIONS, 1)):
        for op in aten_ops(names, "FLOPs"):
            if op not in flop_counter.flop_registry:
                formulas[op] = _per_element(flops)
    return formulas


EXTRA_FLOP_FORMULAS = _extra_formulas()
"""Op -> FLOP formula for ops torch's registry misses: the CPU flash-attention kernel (torch's SDPA formula),
normalizations (2 per output element) and activations (1 per element); shape-based like torch's."""


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
