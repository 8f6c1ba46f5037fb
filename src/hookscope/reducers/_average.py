"""Running averages of one tensor over time: exponential (`EMAReducer`) and cumulative (`CAReducer`)."""

from __future__ import annotations

import collections
import math
from typing import Any

import torch

from .._check import FINITE, checked
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

    Shape changes follow `on_shape_change` as in `EMAReducer`. inferno's constructor arguments are taken by
    keyword: one push is one step of `step_time`, and `dump()` returns the running average after each of the
    pushes within the last `duration` (oldest first): `ceil(duration / step_time)` of them (at least the current
    one), or `floor(duration / step_time) + 1` with `inclusive=True` (a push exactly `duration` ago counts).

    Args:
        on_shape_change: `"drop"` or `"restart"`.
        step_time: The time between pushes (inferno's `step_time`), > 0.
        duration: How long a time `dump()` covers (inferno's `duration`), >= 0.
        inclusive: Whether a push exactly `duration` ago is kept (inferno's `inclusive`).

    Raises:
        ValueError: `on_shape_change` is unknown, `step_time` is not positive or `duration` is negative.

    Example:
        >>> import torch
        >>> average = CAReducer()
        >>> for value in (1.0, 2.0, 6.0):
        ...     average.push(torch.tensor(value))
        >>> average.peek().item()
        3.0
    """

    STATE = Record(
        value=Optional(Tensor(FLOAT)),
        count=Int(min=0),
        history=Optional(Tensor(FLOAT)),
        rules=[
            Rule("value", lambda s: (s["value"] is None) == (s["count"] == 0), "must be None exactly when count is 0"),
            Rule(
                "history", lambda s: (s["history"] is None) == (s["count"] == 0), "must be None exactly when count is 0"
            ),
        ],
    )

    @checked(step_time=FINITE, duration=FINITE)
    def __init__(
        self, on_shape_change: str = "drop", *, step_time: float = 1.0, duration: float = 0.0, inclusive: bool = False
    ) -> None:
        if step_time <= 0:
            raise ValueError(f"step_time must be a positive number (the time between pushes), got {step_time!r}")
        if duration < 0:
            raise ValueError(f"duration must be a number >= 0 (how long a time dump() covers), got {duration!r}")
        super().__init__(on_shape_change)
        self.step_time, self.duration, self.inclusive = float(step_time), float(duration), inclusive
        self._history: collections.deque[torch.Tensor] = collections.deque(maxlen=_kept(step_time, duration, inclusive))

    def config(self) -> dict[str, Any]:
        """Return the constructor arguments."""
        return {
            "on_shape_change": self.on_shape_change,
            "step_time": self.step_time,
            "duration": self.duration,
            "inclusive": self.inclusive,
        }

    def dump(self) -> torch.Tensor | None:
        """Return the running average after each push within the last `duration`, oldest first; `None` when empty."""
        return torch.stack(tuple(self._history)) if self._history else None

    def _fold(self, value: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
        return value * ((self._count - 1) / self._count) + tensor / self._count  # no difference: no overflow

    def _push(self, tensors: tuple[torch.Tensor, ...]) -> None:
        before = self._value
        super()._push(tensors)
        if self._value is before:  # dropped (another shape)
            return
        if self._count == 1:  # a first push, or a restart on another shape
            self._history.clear()
        self._history.append(self._value)  # type: ignore[arg-type]

    def _reset(self) -> None:
        super()._reset()
        self._history.clear()

    def _move(self, device: torch.device) -> None:
        super()._move(device)
        self._history = collections.deque((move(t, device) for t in self._history), maxlen=self._history.maxlen)

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "history": self.dump()}

    def _load(self, state: dict[str, Any]) -> None:
        super()._load(state)
        history = state["history"]
        self._history.clear()
        self._history.extend(() if history is None else history.clone().unbind(0))


def _kept(step_time: float, duration: float, inclusive: bool) -> int:
    """How many pushes `duration` covers at `step_time` per push (a ratio within 1e-9 of a whole number is one)."""
    ratio = duration / step_time
    whole = round(ratio)
    ratio = whole if math.isclose(ratio, whole, rel_tol=1e-9, abs_tol=1e-9) else ratio
    return math.floor(ratio) + 1 if inclusive else max(1, math.ceil(ratio))
