"""`CallLog`: the call order learned from one step, and the place of each module's first non-finite call."""

from __future__ import annotations

import torch

from hookscope.watch._call_log import CallLog

A, R, C, OUT = 0, 1, 2, 3  # a module, a shared activation called before and after C, the output module


def run(log: CallLog, row: int, calls: list[int], bad: frozenset[tuple[int, int]] = frozenset()) -> None:
    """Call the modules of `calls` in row `row`, keeping evidence where asked; `bad`: (module, ordinal) pairs
    whose output held a non-finite value."""
    for index in calls:
        ordinal = log.call(row, index)
        if ordinal is not None:
            log.keep(row, [(index, ordinal, torch.tensor((index, ordinal) in bad))])


def test_a_shared_module_is_placed_at_its_first_non_finite_call() -> None:
    log = CallLog(4)
    run(log, 0, [A, R, C, R, OUT])  # learned
    run(log, 1, [A, R, C, R, OUT], bad=frozenset({(R, 1)}))  # only its second call went bad (after C)
    run(log, 2, [A, R, C, R, OUT], bad=frozenset({(R, 0), (R, 1)}))  # its first call went bad
    assert log.shared == frozenset({R})
    learned, second, first = log.take(range(3))
    assert learned == {A: 0, R: 1, C: 2, OUT: 4}  # no call went bad: first calls
    assert second == {A: 0, R: 3, C: 2, OUT: 4}
    assert first == {A: 0, R: 1, C: 2, OUT: 4}
    assert log.take(range(3)) == [{A: 0, R: 1, C: 2, OUT: 4}] * 3  # taken once: what is left are first calls


def test_the_forwards_of_a_step_are_placed_alike() -> None:
    """Two forwards a step (gradient accumulation): every module twice, the shared one four times; a call of the
    second forward is placed where the same call of the first forward is."""
    log = CallLog(4)
    forward = [A, R, C, R, OUT]
    run(log, 0, forward + forward)
    run(log, 1, forward + forward, bad=frozenset({(R, 3)}))  # the second forward's second call of R
    assert log.shared == frozenset({R})
    assert log.take(range(2))[1] == {A: 0, R: 3, C: 2, OUT: 4}


def test_the_first_step_learns_from_every_call_and_irregular_forwards_give_no_places() -> None:
    log = CallLog(4)
    run(log, 0, [A, R, R, A, R], bad=frozenset({(A, 1)}))  # A twice, R three times: no whole number of forwards
    run(log, 1, [A])
    assert log.shared == frozenset()
    assert log.take(range(2)) == [{}, {}]
