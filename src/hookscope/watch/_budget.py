"""Which steps a watch measures: every `every`-th step, or as many as an overhead budget allows.

With a `budget` (the default: 3 % of the run's time), the watch times its own work on the host -- its hooks on
the steps it measures, the end of those steps, the flushes to the host store and the sinks, the live doctor --
against the time of the steps (from one training batch's start to the next), and measures a step whenever the
run has time to spare: a token bucket that earns `budget x step time` at every step and spends what hookscope
cost. So its cost stays within the budget on any model, small models included, whatever one measured step costs
there. The first `WARMUP_STEPS` steps are measured whatever they cost (the start of training is where
initialization problems show, and the doctor reads trends), and so is the last step when `max_steps` says which
it is. On the steps it does not measure, the per-module hooks return at once.

Timing uses `time.perf_counter` on the host: on a GPU, the statistics' kernels run asynchronously and are not
counted (no synchronization is ever added to time them).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["WARMUP_STEPS", "Budget"]

WARMUP_STEPS = 16
"""Steps measured at the start of a budgeted run, whatever they cost."""


class Budget:
    """Decide which steps are measured, and account for hookscope's own time.

    Args:
        budget: The largest fraction of the run's time hookscope may take (`None`: no budget, use `every`).
        every: Measure exactly every `every`-th step (used when `budget` is `None`).
        max_steps: The number of steps the run is planned for, if known: its last step is measured.
    """

    def __init__(self, budget: float | None, every: int, max_steps: int | None = None) -> None:
        self.budget = budget
        self.every = every
        self.max_steps = max_steps
        self.own = 0.0  # seconds of hookscope's own host time, over the run
        self.total = 0.0  # seconds of the steps' time, over the run
        self.steps = 0  # steps that began
        self.measured = [0, 0.0]  # steps measured after the warm-up that ended, and hookscope's seconds in them
        self.skipped = [0, 0.0]  # steps not measured that ended, and their seconds
        self.largest = 0.0  # the most hookscope took in one step (a flush of many steps' rows, say)
        self._step = -1  # the step last decided
        self._chosen = False  # whether it is measured
        self._credit = 0.0  # the token bucket: seconds hookscope may still spend
        self._spent = 0.0  # own seconds since the last step began
        self._began: float | None = None  # when the open step began (perf_counter)
        self._typical: float | None = None  # a running mean of the time of steps not measured

    def add_own(self, seconds: float) -> None:
        """Count `seconds` of hookscope's own work."""
        self._spent += seconds

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Count the time of the `with` block as hookscope's own work (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._spent += time.perf_counter() - start

    def begin(self, step: int) -> bool:
        """Step number `step` (counted from 0) begins: settle the previous step, and return whether this one is
        measured (asked again for the same step, the same answer)."""
        if step == self._step:
            return self._chosen
        self.settle()
        self._began, self._step = time.perf_counter(), step
        self.steps += 1
        if self.budget is None:
            chosen = step % self.every == 0
        else:
            last = self.max_steps is not None and step == self.max_steps - 1
            chosen = step < WARMUP_STEPS or last or self._credit >= 0.0
        self._chosen = chosen
        return chosen

    def settle(self) -> None:
        """The open step ended (the next one begins, or the run ends): count its time and hookscope's share."""
        if self._began is None:
            return
        elapsed = time.perf_counter() - self._began
        self._began = None
        self.total += elapsed
        if self._chosen and self._step >= WARMUP_STEPS:
            self.measured[0] += 1
            self.measured[1] += self._spent
        elif not self._chosen:
            self.skipped[0] += 1
            self.skipped[1] += elapsed
        # a pause between steps (an eval loop, say) counts as no more than two typical steps
        own = elapsed - self._spent if self._typical is None else min(elapsed - self._spent, 2 * self._typical)
        if not self._chosen:
            self._typical = own if self._typical is None else 0.9 * self._typical + 0.1 * own
        if self.budget is not None and self._step >= WARMUP_STEPS:  # the warm-up is free
            # earn a share of the step's own time, spend what hookscope took; a cheap stretch is not banked
            earned = self.budget * own
            self._credit = min(self._credit + earned - self._spent, earned)
        self.own += self._spent
        self.largest = max(self.largest, self._spent)
        self._spent = 0.0

    def summary(self) -> dict[str, Any]:
        """What was measured, for `WatchResults.meta["measured"]` (JSON): the steps that began, the budget (or
        `every`), hookscope's time over the rest of the steps' time (`cost`: 0.03 is 1.03 times the bare step; `None`
        before a step ends) and what one measured step costs against one left alone (`step_cost`)."""
        summary: dict[str, Any] = {"steps": self.steps}
        summary |= {"budget": self.budget} if self.budget is not None else {"every": self.every}
        spent, bare = self.own, self.total - self.own  # over the steps that ended
        summary["cost"] = spent / bare if bare > 0 else None  # watched time over bare time, less 1
        (measured, own), (skipped, seconds) = self.measured, self.skipped
        # what one measured step costs against a step hookscope left alone (every step measured: 1 + this)
        summary["step_cost"] = own / measured / (seconds / skipped) if measured and skipped and seconds else None
        summary["after_warmup"] = {"measured": measured, "seconds": own, "largest": self.largest}
        return summary
