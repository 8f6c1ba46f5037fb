"""Running averages of one tensor over time: exponential (`EMAReducer`) and cumulative (`CAReducer`)."""

from __future__ import annotations

from typing import Any

import torch

from .._check import checked
from .._schema import FLOAT, Int, Optional, Record, Rule, Tensor
from ._base import Reducer, accumulate_dtype, move, single

__all__ = ["CAReducer", "EMAReducer"]

_SHAPE_POLICIES = ("drop", "restart")


class _RunningReducer(Reducer):
    """An element-wise running value, accumulated in float32 or wider, with a policy for shape changes."""

    STATE = Record(
        value=Optional(Tensor(FLOAT)),
        count=Int(min=0),
        rules=[
            Rule("value", lambda s: (s["value"] is None) == (s["count"] == 0), "must be None exactly when count is 0")
        ],
    )

    @checked()
    def __init__(self, on_shape_change: str = "drop") -> None:
        if on_shape_change not in _SHAPE_POLICIES:
            raise ValueError(f"on_shape_change must be one of {_SHAPE_POLICIES}, got {on_shape_change!r}")
        super().__init__()
        self.on_shape_change = on_shape_change
        self._value: torch.Tensor | None = None
        self._count = 0

    @property
    def count(self) -> int:
        """How many pushes the current value averages."""
        return self._count

    def peek(self) -> torch.Tensor | None:
        """Return the running value, or `None` before the first push."""
        return self._value

    def dump(self) -> torch.Tensor | None:
        """Return the running value along a new first dimension of size 1 (the one thing kept)."""
        return None if self._value is None else self._value.unsqueeze(0)

    def _push(self, tensors: tuple[torch.Tensor, ...]) -> None:
        tensor = single(type(self).__name__, tensors)
        tensor = tensor.to(accumulate_dtype(tensor.dtype, tensor.device))
        if self._value is not None and self._value.shape != tensor.shape:
            if self.on_shape_change == "drop":
                self._dropped += 1
                return
            self._dropped += self._count
            self._value, self._count = None, 0
        self._count += 1
        self._value = tensor.clone() if self._value is None else self._fold(self._value, tensor)

    def _fold(self, value: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _reset(self) -> None:
        self._value, self._count = None, 0

    def _move(self, device: torch.device) -> None:
        if self._value is not None:
            self._value = move(self._value, device)

    def _state(self) -> dict[str, Any]:
        return {"value": self._value, "count": self._count}

    def _load(self, state: dict[str, Any]) -> None:
        value = state["value"]
        self._value = None if value is None else value.clone()
        self._count = state["count"]


class EMAReducer(_RunningReducer):
    """Exponential moving average: the first push starts it, then `value = alpha * x + (1 - alpha) * value`.

    fp16/bf16 inputs accumulate in float32. When a push has another shape than the average (a shorter last
    batch), `on_shape_change="drop"` leaves it out and counts it in `dropped`; `"restart"` starts a new average
    from it and counts the pushes the old one held as dropped.

    Args:
        alpha: Weight of the newest push, in (0, 1].
        on_shape_change: `"drop"` or `"restart"`.

    Raises:
        ValueError: `alpha` is outside (0, 1], or `on_shape_change` is unknown.

    Example:
        >>> import torch
        >>> ema = EMAReducer(alpha=0.5)
        >>> for value in (2.0, 4.0):
        ...     ema.push(torch.tensor(value))
        >>> ema.peek().item()
        3.0
    """

    @checked()
    def __init__(self, alpha: float, on_shape_change: str = "drop") -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
            raise ValueError(f"alpha must be a number in (0, 1], got {alpha!r}")
        super().__init__(on_shape_change)
        self.alpha = float(alpha)

    def config(self) -> dict[str, Any]:
        """Return the constructor arguments."""
        return {"alpha": self.alpha, "on_shape_change": self.on_shape_change}

    def _fold(self, value: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
        # A weighted sum of the two, never their difference: finite extremes of opposite signs cannot overflow.
        return value * (1 - self.alpha) + tensor * self.alpha


class CAReducer(_RunningReducer):
    """Cumulative (arithmetic) average of every push, element-wise, in float32 or wider.

    Shape changes follow `on_shape_change` as in `EMAReducer`.

    Example:
        >>> import torch
        >>> average = CAReducer()
        >>> for value in (1.0, 2.0, 6.0):
        ...     average.push(torch.tensor(value))
        >>> average.peek().item()
        3.0
    """

    def config(self) -> dict[str, Any]:
        """Return the constructor arguments."""
        return {"on_shape_change": self.on_shape_change}

    def _fold(self, value: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
        return value * ((self._count - 1) / self._count) + tensor / self._count  # no difference: no overflow
