"""The memory of one training step, estimated from one forward: saved activations, gradients, optimizer state.

`SavedTensors` records, through `torch.autograd.graph.saved_tensors_hooks`, every tensor autograd saves for
backward during the recorded forward; each storage counts once while it is alive (a weak reference tells), and
those of parameters, buffers and inputs are left out (they are counted as such). Gradients take the bytes of the
trainable parameters; the optimizer state is read from a table of torch's optimizers (how many parameter-sized
tensors and scalar step tensors each keeps per parameter), or from an optimizer instance's own settings
(momentum, amsgrad, centered).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef

from ..hooks._tree import tensor_leaves
from ._params import count_bytes

__all__ = [
    "OPTIMIZER_STATES",
    "SavedTensors",
    "TrainingMemory",
    "check_optimizer",
    "excluded_tensors",
    "optimizer_state_bytes",
    "storage_key",
    "training_memory",
]

OPTIMIZER_STATES: dict[str, tuple[int, int]] = {
    "sgd": (0, 0),
    "sgd_momentum": (1, 0),
    "adam": (2, 1),
    "adamw": (2, 1),
    "adam_amsgrad": (3, 1),
    "adamax": (2, 1),
    "nadam": (2, 2),
    "radam": (2, 1),
    "rmsprop": (1, 1),
    "adagrad": (1, 1),
    "adadelta": (2, 1),
    "asgd": (1, 3),
    "rprop": (2, 1),
}
"""Optimizer name -> (parameter-sized state tensors, scalar state tensors) kept per parameter, torch's defaults."""

_SCALAR_BYTES = 4  # torch keeps `step` and the like as float32 scalars


@dataclass(frozen=True)
class TrainingMemory:
    """Estimated memory of one training step (forward, backward, optimizer step), in bytes.

    Attributes:
        saved_bytes: Activations autograd saves for backward in the forward (each storage once; parameters,
            buffers and inputs apart).
        gradient_bytes: Gradients of the trainable parameters.
        optimizer: The optimizer the state is estimated for (`None`: no optimizer state counted).
        optimizer_bytes: Its state (moments, momentum buffers, step counters).
        param_bytes: Parameters; `buffer_bytes` buffers; `input_bytes` the inputs.
    """

    saved_bytes: int
    gradient_bytes: int
    optimizer: str | None
    optimizer_bytes: int
    param_bytes: int
    buffer_bytes: int
    input_bytes: int

    @property
    def total_bytes(self) -> int:
        """Everything held at the start of backward, plus gradients and optimizer state."""
        return (
            self.saved_bytes + self.gradient_bytes + self.optimizer_bytes + self.param_bytes + self.buffer_bytes
        ) + self.input_bytes

    def to_dict(self) -> dict[str, Any]:
        """Return the estimate as JSON-ready values."""
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "total_bytes": self.total_bytes}


def storage_key(tensor: torch.Tensor) -> int:
    """Identify the storage under `tensor` (views share it); meta storages too, which have no data pointer."""
    return int(StorageWeakRef(tensor.untyped_storage()).cdata)  # type: ignore[no-untyped-call]


class SavedTensors:
    """Bytes of the storages autograd saves for backward while `recording()` is active, each storage once.

    Only weak references are kept: a storage freed before the end (its graph dropped) no longer counts, and one
    allocated later at the same address counts anew.
    """

    def __init__(self, exclude: Iterable[torch.Tensor]) -> None:
        self.excluded = {storage_key(t) for t in exclude}
        self.saved: dict[int, tuple[Any, int]] = {}  # storage key -> (StorageWeakRef, bytes)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = storage_key(tensor)
        known = self.saved.get(key)
        if key not in self.excluded and (known is None or _expired(known[0])):
            storage = tensor.untyped_storage()
            self.saved[key] = (StorageWeakRef(storage), storage.nbytes())  # type: ignore[no-untyped-call]
        return tensor

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Count what autograd saves in the block (tensors are kept as they are; nothing is copied)."""
        with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
            yield

    @property
    def total_bytes(self) -> int:
        """Bytes of the distinct saved storages still alive."""
        return sum(size for ref, size in self.saved.values() if not _expired(ref))


def _expired(ref: Any) -> bool:
    return bool(ref.expired())


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def excluded_tensors(model: nn.Module, inputs: Any) -> list[torch.Tensor]:
    """Tensors whose storage is counted elsewhere than in saved activations: parameters, buffers, inputs."""
    tensors = [t for t in (*model.parameters(), *model.buffers()) if not _is_lazy(t)]
    return tensors + [t for _, t in tensor_leaves(inputs)]


def _is_lazy(tensor: torch.Tensor) -> bool:
    return bool(torch.nn.parameter.is_lazy(tensor))


def _optimizer_name(optimizer: Any) -> str:
    name = type(optimizer).__name__.lower()
    groups = getattr(optimizer, "param_groups", [{}])
    if name == "sgd" and any(g.get("momentum", 0) for g in groups):
        return "sgd_momentum"
    if name in ("adam", "adamw") and any(g.get("amsgrad", False) for g in groups):
        return "adam_amsgrad"
    return name


def _state_counts(optimizer: Any) -> tuple[str, tuple[int, int]]:
    name = optimizer.strip().lower() if isinstance(optimizer, str) else _optimizer_name(optimizer)
    counts = OPTIMIZER_STATES.get(name)
    if counts is None:
        raise ValueError(
            f"optimizer must be a torch.optim optimizer or one of {sorted(OPTIMIZER_STATES)}, got {optimizer!r}; "
            "for another optimizer, count its state yourself (its per-parameter tensors times the params)"
        )
    if name == "rmsprop" and not isinstance(optimizer, str):
        groups = optimizer.param_groups
        extra = int(any(g.get("momentum", 0) for g in groups)) + int(any(g.get("centered", False) for g in groups))
        counts = (counts[0] + extra, counts[1])
    return name, counts


def check_optimizer(optimizer: Any) -> None:
    """Raise `ValueError` now if `optimizer` (a name or an instance) has no known state layout."""
    if optimizer is not None:
        _state_counts(optimizer)


def training_memory(model: nn.Module, saved: SavedTensors, optimizer: Any, input_bytes: int) -> TrainingMemory:
    """Assemble the training-step estimate of `model` from what its recorded forward saved."""
    parameters = [p for p in model.parameters() if not _is_lazy(p)]
    trainable = [p for p in parameters if p.requires_grad]
    name, state = optimizer_state_bytes(optimizer, parameters) if optimizer is not None else (None, 0)
    return TrainingMemory(
        saved_bytes=saved.total_bytes,
        gradient_bytes=count_bytes(trainable),
        optimizer=name,
        optimizer_bytes=state,
        param_bytes=count_bytes(parameters),
        buffer_bytes=count_bytes(model.buffers()),
        input_bytes=input_bytes,
    )


def optimizer_state_bytes(optimizer: Any, parameters: Sequence[torch.Tensor]) -> tuple[str, int]:
    """Return the optimizer's name and the bytes of its state for `parameters` (trainable ones only).

    An optimizer instance counts the parameters it holds; a name counts `parameters`.

    Raises:
        ValueError: the optimizer is not in `OPTIMIZER_STATES`.
    """
    name, (full, scalars) = _state_counts(optimizer)
    if not isinstance(optimizer, str):
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
    trainable = list({id(p): p for p in parameters if p.requires_grad}.values())
    return name, full * count_bytes(trainable) + scalars * _SCALAR_BYTES * len(trainable)
