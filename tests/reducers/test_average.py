"""EMAReducer and CAReducer against a naive loop in float64."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hookscope.reducers import CAReducer, EMAReducer


def _observations(seed: int, count: int, dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(3, 2, generator=generator) * 50).to(dtype) for _ in range(count)]


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    count=st.integers(1, 12),
    alpha=st.floats(0.01, 1.0),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
)
def test_ema_matches_the_recurrence(seed: int, count: int, alpha: float, dtype: torch.dtype) -> None:
    observations = _observations(seed, count, dtype)
    ema = EMAReducer(alpha)
    for observation in observations:
        ema.push(observation)
    expected = observations[0].double()
    for observation in observations[1:]:
        expected = alpha * observation.double() + (1 - alpha) * expected
    value = ema.peek()
    assert value is not None and value.dtype in (torch.float32, torch.float64)
    torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-4)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    count=st.integers(1, 12),
    dtype=st.sampled_from([torch.float16, torch.float32, torch.float64, torch.int32]),
)
def test_ca_matches_the_mean_of_all_pushes(seed: int, count: int, dtype: torch.dtype) -> None:
    observations = _observations(seed, count, dtype)
    average = CAReducer()
    for observation in observations:
        average.push(observation)
    expected = torch.stack([o.double() for o in observations]).mean(0)
    value = average.peek()
    assert value is not None and average.count == count
    torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-4)


def test_fp16_inputs_accumulate_in_fp32() -> None:
    average = CAReducer()
    for _ in range(3):
        average.push(torch.full((4096,), 300.0, dtype=torch.float16))
    value = average.peek()
    assert value is not None and value.dtype == torch.float32 and value.square().sum().isfinite()


def test_a_push_of_another_shape_is_dropped_by_default() -> None:
    average = CAReducer()
    for rows in (4, 4, 1):
        average.push(torch.full((rows,), float(rows)))
    value = average.peek()
    assert value is not None and value.tolist() == [4.0] * 4
    assert (average.count, average.dropped, average.pushes) == (2, 1, 3)


def test_restart_policy_starts_over_and_counts_what_it_forgot() -> None:
    ema = EMAReducer(0.5, on_shape_change="restart")
    for rows in (4, 4, 1):
        ema.push(torch.full((rows,), float(rows)))
    value = ema.peek()
    assert value is not None and value.tolist() == [1.0]
    assert (ema.count, ema.dropped) == (1, 2)


def test_dump_holds_the_one_value() -> None:
    ema = EMAReducer(0.5)
    ema.push(torch.ones(2))
    dumped = ema.dump()
    assert dumped is not None and dumped.shape == (1, 2)


@pytest.mark.parametrize(
    ("alpha", "error"), [(0, ValueError), (1.5, ValueError), (True, TypeError), ("0.1", TypeError)]
)
def test_alpha_must_be_in_the_unit_interval(alpha: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"alpha must be a number( in \(0, 1\])?, got"):
        EMAReducer(alpha)  # type: ignore[arg-type]


def test_shape_policy_must_be_known() -> None:
    with pytest.raises(ValueError, match=r"on_shape_change must be one of \('drop', 'restart'\), got 'grow'"):
        CAReducer(on_shape_change="grow")


@pytest.mark.parametrize(
    ("step_time", "duration", "inclusive", "kept"),
    [(1.0, 0.0, False, 1), (1.0, 0.0, True, 1), (0.5, 2.0, False, 4), (0.5, 2.0, True, 5), (0.3, 1.0, False, 4)],
)
def test_careducer_dump_is_the_running_average_over_the_last_duration(
    step_time: float, duration: float, inclusive: bool, kept: int
) -> None:
    observations = _observations(3, 7, torch.float32)
    average = CAReducer(step_time=step_time, duration=duration, inclusive=inclusive)
    for observation in observations:
        average.push(observation)
    running = [torch.stack(observations[: k + 1]).double().mean(0) for k in range(len(observations))]  # naive
    dumped = average.dump()
    assert dumped is not None and dumped.shape == (kept, 3, 2)
    torch.testing.assert_close(dumped.double(), torch.stack(running[-kept:]), rtol=1e-6, atol=1e-4)
    assert average.config() == {
        "on_shape_change": "drop", "step_time": step_time, "duration": duration, "inclusive": inclusive
    }  # fmt: skip


def test_careducer_history_survives_its_state_and_a_restart() -> None:
    average = CAReducer("restart", step_time=1.0, duration=2.0)
    for value in (1.0, 3.0, 5.0):
        average.push(torch.full((2,), value))
    copy = CAReducer("restart", step_time=1.0, duration=2.0)
    copy.load_state_dict(average.state_dict())
    torch.testing.assert_close(copy.dump(), average.dump())
    average.push(torch.zeros(3))  # another shape: a new average, its history starts again
    assert average.dump().shape == (1, 3) and average.dropped == 3  # type: ignore[union-attr]


def test_careducer_refuses_bad_times_naming_the_public_class() -> None:
    with pytest.raises(ValueError, match=r"^step_time must be a positive number \(the time between pushes\), got 0"):
        CAReducer(step_time=0)
    with pytest.raises(ValueError, match=r"^duration must be a number >= 0 .*got -1"):
        CAReducer(duration=-1)
    with pytest.raises(TypeError, match=r"^CAReducer\(\) got an unexpected keyword argument 'step'"):
        CAReducer(step=1.0)  # type: ignore[call-arg]
