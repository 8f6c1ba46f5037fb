"""`ForwardFrames`: the end of each root forward is told to every listener, in order, with whether it completed."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn

from hookscope.callbacks._steps import ForwardFrames, Frame


class Raises(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False
        self.linear = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("planted")
        return self.linear(x)


def test_every_listener_sees_each_frame_end_in_order_with_whether_it_completed() -> None:
    model = Raises()
    heard: list[Any] = []
    frames = ForwardFrames(
        True,
        (
            lambda frame, done: heard.append(("first", done, frame.items[:])),
            lambda frame, done: heard.append(("second", done)),
        ),
        lambda frame: frame.items.append("staged"),
    )
    handles = frames.register(model, owner=model, tags=("test",), errors=None)
    try:
        model(torch.randn(1, 2))
        model.fail = True
        with pytest.raises(RuntimeError, match="planted"):
            model(torch.randn(1, 2))
    finally:
        for handle in handles:
            handle.remove()
    assert heard == [("first", True, ["staged"]), ("second", True), ("first", False, ["staged"]), ("second", False)]
    assert frames.current() is None  # no frame left open after the forward that raised


def test_one_listener_is_called_as_before() -> None:
    model = Raises()
    ends: list[bool] = []

    def on_exit(frame: Frame, done: bool) -> None:
        ends.append(done)

    frames = ForwardFrames(True, on_exit)
    handles = frames.register(model, owner=model, tags=("test",), errors=None)
    with torch.no_grad():
        model(torch.randn(1, 2))  # no_grad: a frame with a reason, still told
    for handle in handles:
        handle.remove()
    model(torch.randn(1, 2))  # removed: not told
    assert ends == [True]
