"""The stretches a budget counted in a test: the arguments of every `Budget.stretch_ended` call, each still made."""

from __future__ import annotations

import pytest

from hookscope.callbacks._budget import Budget

Stretch = tuple[int, int, tuple[float, int] | None]  # (first step, count, the later part timed apart)


def record_stretches(monkeypatch: pytest.MonkeyPatch) -> list[Stretch]:
    """Record, for the rest of the test, what each `Budget.stretch_ended` call is given (then make the call)."""
    ended: list[Stretch] = []
    original = Budget.stretch_ended

    def spy(self: Budget, first: int, count: int, inner: tuple[float, int] | None = None) -> None:
        ended.append((first, count, inner))
        original(self, first, count, inner)

    monkeypatch.setattr(Budget, "stretch_ended", spy)
    return ended
