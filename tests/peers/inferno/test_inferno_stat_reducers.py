"""inferno's own tests of its statistics reducers, run against hookscope's `CAReducer` (issue 26).

Ported from mdominijanni/inferno, `test/observe/test_stat_reducers.py` (https://github.com/mdominijanni/inferno),
Copyright (c) 2023, Marissa Dominijanni, BSD 3-Clause License (the notice and conditions are in
`LICENSE-BSD-3-Clause.txt` beside this file). Changes: the import. The assertions and expected values are
inferno's.
"""

from __future__ import annotations

import random

import pytest
import torch

from hookscope.reducers import CAReducer


def aaeq(t0, t1, eps=1e-6) -> bool:  # type: ignore[no-untyped-def]
    try:
        return bool(t0 == t1)
    except RuntimeError:
        if torch.all(t0 == t1):
            return True
        else:
            return torch.all((t0 - t1).abs() < eps)  # type: ignore[no-any-return]


class TestCAReducer:
    def test_clear(self):  # type: ignore[no-untyped-def]
        dt = random.uniform(0.4, 1.7)
        duration = 20 * dt
        data = torch.rand(20, random.randint(3, 5), random.randint(3, 5))

        reducer = CAReducer(step_time=dt, duration=duration, inclusive=False)
        for k in range(data.shape[0]):
            reducer(data[k])

        assert reducer._count != 0
        reducer.clear()
        assert reducer._count == 0

    @pytest.mark.parametrize("dtype", (torch.float32, torch.bool), ids=("float32", "bool"))
    def test_forward_peek(self, dtype):  # type: ignore[no-untyped-def]
        dt = random.uniform(0.4, 1.7)
        duration = 12 * dt
        data = torch.rand(20, random.randint(3, 5), random.randint(3, 5))
        if dtype == torch.bool:  # noqa: SIM108  (inferno's code)
            data = data > 0.5
        else:
            data = data.to(dtype=dtype)

        reducer = CAReducer(step_time=dt, duration=duration, inclusive=False)
        for k in range(data.shape[0]):
            reducer(data[k])
            assert aaeq(reducer.peek(), data[slice(0, k + 1)].float().mean(0))
