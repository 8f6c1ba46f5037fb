"""HistoryReducer and PassthroughReducer: what is kept, in which order, and what view(step) returns."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hookscope.reducers import HistoryReducer, PassthroughReducer


@settings(max_examples=25, deadline=None)
@given(
    pushes=st.integers(1, 30),
    capacity=st.one_of(st.none(), st.integers(1, 10)),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.int64]),
)
def test_keeps_the_newest_pushes_in_order(pushes: int, capacity: int | None, dtype: torch.dtype) -> None:
    observations = [torch.full((2, 3), step, dtype=dtype) for step in range(pushes)]
    history = HistoryReducer(capacity=capacity)
    for observation in observations:
        history.push(observation)
    kept = observations if capacity is None else observations[-capacity:]
    dumped = history.dump()
    assert isinstance(dumped, torch.Tensor) and dumped.dtype == dtype
    assert torch.equal(dumped, torch.stack(kept))
    assert history.dropped == pushes - len(kept)
    first = pushes - len(kept)
    for step in range(first, pushes):
        assert torch.equal(history.view(step), observations[step])
    assert torch.equal(history.view(-1), observations[-1])
    peeked = history.peek()
    assert peeked is not None and torch.equal(peeked, observations[-1])


def test_stored_copies_ignore_later_in_place_changes() -> None:
    history = HistoryReducer()
    tensor = torch.zeros(3)
    history.push(tensor)
    tensor.add_(1)
    peeked = history.peek()
    assert peeked is not None and peeked.tolist() == [0.0, 0.0, 0.0]


def test_stored_copies_are_detached() -> None:
    history = HistoryReducer()
    weight = torch.ones(2, requires_grad=True)
    history.push(weight * 2)
    peeked = history.peek()
    assert peeked is not None and peeked.grad_fn is None and not peeked.requires_grad


def test_dump_is_a_list_only_when_shapes_differ() -> None:
    history = HistoryReducer()
    history.push(torch.ones(4, 2))
    history.push(torch.ones(1, 2))
    dumped = history.dump()
    assert isinstance(dumped, list) and [t.shape for t in dumped] == [(4, 2), (1, 2)]


def test_offload_device_stores_copies_there() -> None:
    history = HistoryReducer(device="cpu")
    history.push(torch.ones(2))
    peeked = history.peek()
    assert peeked is not None and peeked.device.type == "cpu"
    assert history.config() == {"capacity": None, "device": "cpu"}


def test_view_of_a_dropped_or_future_step_says_which_are_kept() -> None:
    history = HistoryReducer(capacity=2)
    for step in range(5):
        history.push(torch.tensor(step))
    with pytest.raises(ValueError, match=r"step must be a kept push, from 3 to 4 .* got 1; .* capacity=2"):
        history.view(1)
    with pytest.raises(ValueError, match="got 5"):
        history.view(5)
    with pytest.raises(ValueError, match="got '3'"):
        history.view("3")  # type: ignore[arg-type]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity must be a positive int or None, got 0"):
        HistoryReducer(capacity=0)


def test_passthrough_keeps_the_latest_and_counts_the_rest() -> None:
    latest = PassthroughReducer()
    for step in range(4):
        latest.push(torch.tensor([float(step)]))
    peeked, dumped = latest.peek(), latest.dump()
    assert peeked is not None and peeked.tolist() == [3.0]
    assert isinstance(dumped, torch.Tensor) and dumped.shape == (1, 1)
    assert latest.dropped == 3 and latest.view(3).tolist() == [3.0]
