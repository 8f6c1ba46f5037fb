"""A uniform sample of every value pushed (reservoir), and quantiles estimated from it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .._check import checked, shown
from .._schema import FLOAT, INT, Int, Optional, Record, Rule, Str, Tensor
from ._base import Reducer, move, wide_dtype

__all__ = ["QuantileReducer", "ReservoirReducer"]


def _generator_fits(state: Mapping[str, Any]) -> bool:
    """Whether a saved generator state can be restored (a device type absent here is re-seeded, not refused)."""
    saved, device = state["generator"], state["generator_device"]
    if saved is None:
        return True
    try:
        generator = torch.Generator(device=device)
    except (RuntimeError, TypeError):
        return True  # no such device here: `_load` leaves the generator to be seeded again
    try:
        generator.set_state(saved.clone())
    except RuntimeError:
        return False
    return True


class ReservoirReducer(Reducer):
    """Keep a uniform random sample, without replacement, of `capacity` of the finite values pushed.

    Every element of every tensor pushed is one value. Each value draws a random key and the sample is the
    `capacity` values with the smallest keys (Efraimidis-Spirakis with equal weights): a batch is folded in
    with one `topk` on the device, no sync. Non-finite values are counted in `nonfinite` and never sampled.

    Determinism: keys come from a `torch.Generator` on the state's device, seeded with `seed` at the first push
    and saved in `state_dict()`, so the same pushes give the same sample and a restored reducer continues the
    same random stream. Moving the state to another device type re-seeds the generator with
    `seed + values_seen` (generator states do not carry across device types).

    Args:
        capacity: How many values to keep.
        seed: Seed of the generator.

    Raises:
        ValueError: `capacity` is not a positive int, or `seed` not an int.

    Example:
        >>> import torch
        >>> reservoir = ReservoirReducer(capacity=3)
        >>> reservoir.push(torch.arange(100.0))
        >>> reservoir.peek().shape, reservoir.dropped
        (torch.Size([3]), 97)
    """

    STATE = Record(
        values=Tensor(FLOAT, shape=("capacity",)),
        keys=Tensor(FLOAT, shape=("capacity",)),
        order=Tensor(INT, shape=("capacity",)),
        nonfinite=Tensor(INT, shape=()),
        seen=Int(min=0),
        generator=Optional(Tensor(("uint8",), shape=("*",))),
        generator_device=Optional(Str()),
        rules=[Rule("generator", _generator_fits, "must be a torch.Generator state of the generator_device")],
    )

    @checked()
    def __init__(self, capacity: int, seed: int = 0) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        super().__init__()
        self.capacity = capacity
        self.seed = seed
        self._acc: dict[str, torch.Tensor] = {}
        self._seen = 0
        self._generator: torch.Generator | None = None
        self._reset()

    def config(self) -> dict[str, Any]:
        """Return the constructor arguments."""
        return {"capacity": self.capacity, "seed": self.seed}

    @property
    def seen(self) -> int:
        """How many values (elements, finite or not) were pushed."""
        return self._seen

    @property
    def nonfinite(self) -> torch.Tensor:
        """How many NaN and ±inf values were pushed (never sampled)."""
        return self._acc["nonfinite"]

    @property
    def dropped(self) -> int:
        """How many finite values are not in the sample (reading it syncs with the device)."""
        kept = int((self._acc["keys"] < float("inf")).sum())
        return self._seen - int(self._acc["nonfinite"]) - kept

    def peek(self) -> torch.Tensor | None:
        """Return the sampled values in the order they were pushed, or `None` before the first push."""
        return self._kept()

    def _kept(self) -> torch.Tensor | None:
        if self._pushes == 0:
            return None
        keys, values, order = self._acc["keys"], self._acc["values"], self._acc["order"]
        kept = keys < float("inf")
        return values[kept][torch.argsort(order[kept])]

    def dump(self) -> torch.Tensor | None:
        """Return the sampled values, oldest first (one value per row of the first dimension)."""
        return self.peek()

    def quantile(self, q: float | Sequence[float] | torch.Tensor) -> torch.Tensor | None:
        """Estimate the quantiles `q` (in [0, 1]) of every finite value pushed from the sample.

        Raises:
            TypeError: `q` is not a number, a sequence of numbers or a tensor.
            ValueError: a quantile is outside [0, 1], or NaN.
        """
        try:
            checked_levels = torch.as_tensor(q, dtype=torch.float64, device="cpu")
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"q must be a level in [0, 1], or a sequence or tensor of them, got {shown(q)}") from None
        if not bool(((checked_levels >= 0) & (checked_levels <= 1)).all()):  # NaN fails both comparisons
            raise ValueError(f"q must be in [0, 1] (every level), got {shown(q)}")
        sample = self._kept()
        if sample is None:
            return None
        levels = checked_levels.to(dtype=sample.dtype, device=sample.device)
        if sample.numel() == 0:
            return torch.full_like(levels, float("nan"))
        return torch.quantile(sample, levels)

    def _push(self, tensors: tuple[torch.Tensor, ...]) -> None:
        for tensor in tensors:
            if tensor.numel():
                self._sample(tensor.reshape(-1))

    def _sample(self, values: torch.Tensor) -> None:
        acc = self._acc
        dtype = acc["values"].dtype
        values = values.to(dtype)
        offset = values - torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)  # 0 where finite, else NaN/inf
        draws = torch.rand(values.numel(), generator=self._random(), dtype=dtype, device=self._device)
        keys = torch.cat([acc["keys"], torch.nan_to_num(draws + offset.abs(), nan=float("inf"))])
        chosen = torch.topk(keys, self.capacity, largest=False).indices
        order = torch.arange(self._seen, self._seen + values.numel(), device=self._device)
        acc["keys"] = keys[chosen]
        acc["values"] = torch.cat([acc["values"], values])[chosen]
        acc["order"] = torch.cat([acc["order"], order])[chosen]
        acc["nonfinite"] = acc["nonfinite"] + torch.count_nonzero(offset)
        self._seen += values.numel()

    def _random(self) -> torch.Generator:
        if self._generator is None:
            self._generator = torch.Generator(device=self._device)
            self._generator.manual_seed(self.seed + self._seen)
        return self._generator

    def _reset(self) -> None:
        dtype = wide_dtype(self._device)
        self._acc = {
            "values": torch.zeros(self.capacity, dtype=dtype),
            "keys": torch.full((self.capacity,), float("inf"), dtype=dtype),
            "order": torch.zeros(self.capacity, dtype=torch.int64),
            "nonfinite": torch.zeros((), dtype=torch.int64),
        }
        self._seen = 0
        self._generator = None

    def _move(self, device: torch.device) -> None:
        self._acc = {name: move(tensor, device) for name, tensor in self._acc.items()}
        if self._generator is not None and self._generator.device.type != device.type:
            self._generator = None

    def _state(self) -> dict[str, Any]:
        generator = self._generator
        return {
            **self._acc,
            "seen": self._seen,
            "generator": None if generator is None else generator.get_state(),
            "generator_device": None if generator is None else generator.device.type,
        }

    def _sizes(self) -> dict[str, int]:
        return {"capacity": self.capacity}

    def _load(self, state: dict[str, Any]) -> None:
        generator = None
        if state["generator"] is not None and state["generator_device"] == self._device.type:
            generator = torch.Generator(device=self._device)
            generator.set_state(state["generator"].clone())
        self._acc = {name: state[name].clone() for name in ("values", "keys", "order", "nonfinite")}
        self._seen = state["seen"]
        self._generator = generator


class QuantileReducer(ReservoirReducer):
    """Quantiles `q` of every finite value pushed, estimated from a reservoir sample of `capacity` values.

    `peek()` returns the quantiles (a 0-d tensor for one level, else one per level); `dump()` the sample.

    Args:
        q: The quantile levels, in [0, 1].
        capacity: Size of the sample behind the estimate.
        seed: Seed of the reservoir's generator.

    Raises:
        ValueError: a level is outside [0, 1], or `capacity` / `seed` are invalid.

    Example:
        >>> import torch
        >>> median = QuantileReducer(0.5, capacity=1000)
        >>> median.push(torch.arange(101.0))
        >>> median.peek().item()
        50.0
    """

    @checked()
    def __init__(self, q: float | Sequence[float], capacity: int = 4096, seed: int = 0) -> None:
        levels = [float(q)] if isinstance(q, (int, float)) else [float(level) for level in q]
        if not levels or not all(0.0 <= level <= 1.0 for level in levels):
            raise ValueError(f"q must be a level or a non-empty sequence of levels in [0, 1], got {q!r}")
        super().__init__(capacity=capacity, seed=seed)
        self.q: float | list[float] = levels[0] if isinstance(q, (int, float)) else levels

    def config(self) -> dict[str, Any]:
        """Return the constructor arguments."""
        return {"q": self.q, "capacity": self.capacity, "seed": self.seed}

    def peek(self) -> torch.Tensor | None:
        """Return the estimated quantiles, or `None` before the first push."""
        return self.quantile(self.q)

    def dump(self) -> torch.Tensor | None:
        """Return the sample behind the estimate, oldest first."""
        return self._kept()
