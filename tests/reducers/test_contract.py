"""The contract every reducer keeps: no sync on push, bounded memory, shape changes, persistence, errors."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable

import pytest
import torch

from hookscope.reducers import (
    CAReducer,
    EMAReducer,
    HistogramReducer,
    HistoryReducer,
    PassthroughReducer,
    QuantileReducer,
    Reducer,
    ReservoirReducer,
    StatsReducer,
)

FACTORIES: dict[str, Callable[[], Reducer]] = {
    "history": lambda: HistoryReducer(),
    "ring": lambda: HistoryReducer(capacity=7),
    "passthrough": PassthroughReducer,
    "ema": lambda: EMAReducer(alpha=0.3),
    "ca": CAReducer,
    "stats": StatsReducer,
    "histogram": lambda: HistogramReducer(bins=16),
    "histogram_fixed": lambda: HistogramReducer(bins=5, range=(-1.0, 2.0)),
    "reservoir": lambda: ReservoirReducer(capacity=32),
    "quantile": lambda: QuantileReducer([0.1, 0.9], capacity=32),
}


def _forbid(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("host-device sync during push")

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_push_never_syncs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reducer = FACTORIES[name]()
    batches = [torch.randn(4, 3) * (step % 5 + 1) for step in range(300)]
    batches[17][0, 0] = float("nan")
    with monkeypatch.context() as patched:
        _forbid(patched)
        for batch in batches:
            reducer.push(batch)
    assert reducer.pushes == 300
    with pytest.raises(AssertionError, match="sync during push"), monkeypatch.context() as patched:
        _forbid(patched)
        torch.ones(1).item()


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_shape_changes_are_accepted(name: str) -> None:
    reducer = FACTORIES[name]()
    for rows in (8, 8, 3, 8, 0):
        reducer.push(torch.randn(rows, 2))
    assert reducer.pushes == 5
    assert reducer.peek() is not None


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_state_round_trip_continues_exactly(name: str, tmp_path: object) -> None:
    batches = [torch.randn(5, 3) for _ in range(12)]
    uninterrupted, first = FACTORIES[name](), FACTORIES[name]()
    for batch in batches:
        uninterrupted.push(batch)
    for batch in batches[:7]:
        first.push(batch)
    path = first.save(tmp_path / "reducer.safetensors")  # type: ignore[operator]
    resumed = type(first).load(path)  # a new reducer of the saved type and config
    for batch in batches[7:]:
        resumed.push(batch)
    assert resumed.pushes == uninterrupted.pushes and resumed.dropped == uninterrupted.dropped
    _assert_same(resumed.peek(), uninterrupted.peek())
    _assert_same(resumed.dump(), uninterrupted.dump())


def _assert_same(left: object, right: object) -> None:
    if hasattr(left, "as_dict"):
        left, right = left.as_dict(), right.as_dict()  # type: ignore[attr-defined]
        assert left.keys() == right.keys()
        for key in left:
            torch.testing.assert_close(left[key], right[key], rtol=0, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(left, right, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_clear_forgets_and_peek_is_none_when_empty(name: str) -> None:
    reducer = FACTORIES[name]()
    assert reducer.peek() is None and reducer.dump() is None
    reducer.push(torch.randn(3))
    reducer.clear()
    assert reducer.peek() is None and reducer.dump() is None
    assert reducer.pushes == 0 and reducer.dropped == 0


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_copies_are_independent(name: str) -> None:
    reducer = FACTORIES[name]()
    twin = copy.deepcopy(reducer)
    reducer.push(torch.randn(3))
    assert twin.pushes == 0 and twin.peek() is None


def test_history_memory_is_bounded_and_drops_are_counted() -> None:
    history = HistoryReducer(capacity=100)
    value = torch.zeros(())
    for _ in range(100_000):
        history.push(value)
    dumped = history.dump()
    assert isinstance(dumped, torch.Tensor) and dumped.shape == (100,)
    assert history.dropped == 99_900
    assert len(history.state_dict()["state"]["kept"]) == 100


def test_pushes_from_threads_are_all_counted() -> None:
    stats = StatsReducer()

    def work() -> None:
        for _ in range(200):
            stats.push(torch.ones(3))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summary = stats.peek()
    assert summary is not None and int(summary.count) == 4 * 200 * 3 and stats.pushes == 800


def test_push_rejects_non_tensors_and_empty_pushes() -> None:
    with pytest.raises(TypeError, match=r"push takes tensors, got float at position 1"):
        StatsReducer().push(torch.ones(1), 2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="push takes at least one tensor, got none"):
        StatsReducer().push()


def test_trajectory_reducers_take_one_tensor_per_push() -> None:
    with pytest.raises(TypeError, match=r"HistoryReducer.push takes one tensor per observation, got 2"):
        HistoryReducer().push(torch.ones(1), torch.ones(1))


def test_complex_tensors_are_refused_with_the_fix() -> None:
    with pytest.raises(TypeError, match=r"must be real, got dtype torch.complex64; push x.abs\(\)"):
        StatsReducer().push(torch.ones(2, dtype=torch.complex64))


def test_view_needs_history() -> None:
    with pytest.raises(TypeError, match="StatsReducer keeps no history"):
        StatsReducer().view(0)


def test_load_refuses_another_type_or_config() -> None:
    with pytest.raises(ValueError, match=r"state.config must come from a HistoryReducer with config \{'capacity': 3"):
        HistoryReducer(capacity=3).load_state_dict(HistoryReducer(capacity=4).state_dict())
    with pytest.raises(ValueError, match="got StatsReducer"):
        EMAReducer(0.5).load_state_dict(StatsReducer().state_dict())


def test_load_refuses_other_files(tmp_path: object) -> None:
    path = tmp_path / "not.safetensors"  # type: ignore[operator]
    path.write_bytes(b"\x80\x04junk-pickle")
    with pytest.raises(ValueError, match="truncated, corrupt or not a safetensors file"):
        StatsReducer.load(path)


def test_state_is_on_the_device_given_by_to() -> None:
    stats = StatsReducer().to("cpu")
    stats.push(torch.ones(2))
    assert stats.device == torch.device("cpu")
    assert repr(stats) == "StatsReducer(near_zero=0.001)"
