"""Which steps a monitor measures: every `every`-th step, or as many as an overhead budget allows.

With a `budget` (the default of `watch()` and `ActivationStats`: 3 % of the run's time), the monitor times its own
work on the host -- its hooks on the steps it measures, the end of those steps, the flushes to the host store and
the sinks, the live doctor -- against the time of the steps (from one step's start to the next), and measures a
step whenever the run has time to spare: a token bucket that earns `budget x step time` at every step and spends
what the monitor cost. So its cost stays within the budget on any model, small models included, whatever one
measured step costs there. The first `WARMUP_STEPS` steps are measured whatever they cost (the start of training
is where initialization problems show, and the doctor reads trends), and so is the last step when `max_steps`
says which it is; the first step after them is left alone, to learn what a step takes without the monitor. What
a measured step takes beyond that is its cost too, timed from the host or not (hooks traced into a compiled graph,
torch's slower path for hooked modules). On the steps it does not measure, the monitor's per-module hooks are
off the modules (paused: `hookscope.hooks.HookHandle.pause`), so the model runs as if unwatched; what is left is
the fixed cost of following the steps (an optimizer hook or a root hook), which the budget does not see. A run of
steps left alone can be foreseen at the typical step time (`stretch`, which sets aside what is still to be
charged: the step after a measured one, the stretch's ends) and followed by a count alone (`stretch_ended` counts
their time as each step would be counted; its later half is timed apart, and what the stretch took beyond as
many steps at that pace is charged too: its ends, and its first steps, which run slower right after a measured
one while the caches refill). The typical step time is learned so that a slow step (a pause, a
busy machine, a garbage collection) moves it as one `SLOWER` times the typical would: the yardstick of what
measuring costs stays what a step left alone takes.

Timing uses `time.perf_counter` on the host: on a GPU, the statistics' kernels run asynchronously and are counted
only as far as they lengthen the step on the host (no synchronization is ever added to time them).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["LONGEST_STRETCH", "WARMUP_STEPS", "Budget", "check_budget", "later_part"]

WARMUP_STEPS = 16
"""Steps measured at the start of a budgeted run, whatever they cost."""

LONGEST_STRETCH = 4096
"""The most steps `Budget.stretch` leaves alone in one go (then it is asked again)."""


LATER_FROM = 4
"""Stretches of at least this many steps have their later half timed apart (`later_part`)."""


def later_part(count: int) -> int:
    """How many of the last steps of a stretch of `count` steps left alone are timed apart (0: none): the steps
    right after a measured one are slower (caches and the interpreter's refilled), and a step of the stretch's
    later half is what a step left alone takes (`Budget.stretch_ended`)."""
    return count // 2 if count >= LATER_FROM else 0


ENDS = 4
"""The most the first steps and the ends of a stretch count for beyond the pace of its later part, in its steps
(as a measured step's own excess does: `Budget._charge`)."""


SLOWER = 1.25
"""The most a step left alone counts for, in typical steps, when the typical step time is learned from it."""


def check_budget(budget: float | None, none_means: str) -> float | None:
    """`budget` as a float, or `None` (which means `none_means`, for the message).

    Raises:
        ValueError: `budget` is not a fraction in (0, 1).
    """
    if budget is not None and not (isinstance(budget, (int, float)) and 0 < budget < 1):
        raise ValueError(
            f"budget must be a fraction of the step time in (0, 1), such as 0.03, or None ({none_means}), got "
            f"{budget!r}"
        )
    return None if budget is None else float(budget)


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
        self._follows = False  # whether the step before it was measured (it may be slower for it: caches refilled)
        self._credit = 0.0  # the token bucket: seconds hookscope may still spend
        self._spent = 0.0  # own seconds since the last step began
        self._began: float | None = None  # when the open step began (perf_counter)
        self._typical: float | None = None  # a running mean of the time of steps not measured
        self._decided: tuple[int, bool] = (-1, False)  # (step, measured) decided before it began (`decide`)
        self._ended: float | None = None  # when the last step was ended by `end` (the next one's time runs from it)
        self._after = 0.0  # what the last step after a measured one cost (`stretch` foresees the next such one)
        self._ends = 0.0  # what following the ends of the last stretch cost (`stretch_ended`)

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
        measured (asked again for the same step, the same answer; decided beforehand by `decide`, that answer)."""
        if step == self._step:
            return self._chosen
        decided, ended, closing = self._decided, self._ended, self._spent
        self.settle()
        # after `end`, the next step's time runs from there, less what hookscope did meanwhile (closing the step)
        self._began = time.perf_counter() if ended is None else ended + closing
        self._ended, self._step = None, step
        self.steps += 1
        self._follows = self._chosen
        self._chosen = decided[1] if decided[0] == step else self._rule(step, self._credit)
        return self._chosen

    def end(self) -> None:
        """The open step is done (its optimizer step ran): settle it now, and count the next step's time from here
        (not from when it begins), so that steps whose start is seen at different points (a forward, an optimizer
        step) are timed alike. What hookscope does until the next step begins (closing this step's row) is still
        this step's cost."""
        if self._began is not None:
            self.settle()
            self._ended = time.perf_counter()

    def decide(self, step: int) -> bool:
        """Decide now, while the previous step ends, whether step `step` will be measured (`begin(step)` keeps the
        answer): the credit the open step is earning so far counts (as `settle` will count it)."""
        credit = self._credit
        if self.budget is not None and self._began is not None and self._step >= WARMUP_STEPS:
            credit = self._charge(time.perf_counter() - self._began)[2]
        chosen = self._rule(step, credit)
        self._decided = (step, chosen)
        return chosen

    def _rule(self, step: int, credit: float) -> bool:
        if self.budget is None:
            return step % self.every == 0
        if step < WARMUP_STEPS or (self.max_steps is not None and step == self.max_steps - 1):
            return True
        if self._typical is None:  # first learn what a step left alone takes: the yardstick of the cost
            return False
        return credit >= 0.0

    def stretch(self, first: int) -> int:
        """Step `first` was decided not to be measured (`decide`): how many steps from it on will be left alone, if
        each takes the typical time of a step left alone (with `every`: up to the next measured one), at least 1
        and at most `LONGEST_STRETCH`. A monitor that follows those steps by a count alone (`stretch_ended`) costs
        the run nothing more per step than that count."""
        typical = self._typical
        if typical is None:
            return 1
        # what is still to be charged: the open step, if it follows a measured one, and the stretch's own ends
        after = self._began is not None and self._follows and not self._chosen
        credit = self._credit - self._ends - (self._after if after else 0.0)
        earned, count = (self.budget or 0.0) * typical, 1
        while count < LONGEST_STRETCH:
            credit = min(credit + earned, earned)  # as `settle` counts a step left alone at the typical time
            if self._rule(first + count, credit):
                break
            count += 1
        return count

    def stretch_ended(self, first: int, count: int, inner: tuple[float, int] | None = None) -> None:
        """Steps `first` to `first + count - 1`, left alone (none was measured or followed a measured one), ended
        now, the first beginning when the step before it ended (`end`), none seen to begin or end: count them as
        `begin` and `end` would, each taking their mean time, in one go.

        `inner` is `(seconds, steps)` of the stretch's later part, timed apart (`later_part`): a step there is
        what a step left alone takes, and what the stretch took beyond as many such steps is the monitor's cost
        too: the steps right after a measured one, slower while the caches refill, and following the stretch's
        ends (at most `ENDS` such steps: more is a pause, not the monitor)."""
        now = time.perf_counter()
        ended, closing = self._ended, self._spent
        self.settle()  # the step before them: what hookscope did after it ended
        began = now if ended is None else ended + closing
        elapsed = max(now - began, 0.0)
        mean, typical, ends = elapsed / count, self._typical, 0.0
        if inner is not None and inner[1] > 0 and inner[0] > 0:
            mean = inner[0] / inner[1]
            ends = min(max(elapsed - count * mean, 0.0), ENDS * mean)
            self._ends = ends
        own = mean if typical is None else min(mean, 2 * typical)  # a pause counts as no more than two typical steps
        if self.budget is not None and first >= WARMUP_STEPS:
            earned = self.budget * own
            self._credit = min(self._credit + count * earned - ends, earned)  # `settle`'s rule, `count` times
        if first >= WARMUP_STEPS:
            self.measured[1] += ends  # what measuring costs: its steps, the steps after them, the stretches' ends
        self._learn(mean, 1 - 0.9**count)
        self.total += elapsed
        self.own += ends
        self.largest = max(self.largest, ends)
        self.skipped[0] += count
        self.skipped[1] += elapsed - ends
        self.steps += count
        self._step, self._chosen, self._follows = first + count - 1, False, False
        self._began, self._ended = None, now

    def settle(self) -> None:
        """The open step ended (the next one begins, or the run ends): count its time and hookscope's share."""
        if self._began is None:
            if self._ended is not None:
                self._charge_closing()
            return
        elapsed = time.perf_counter() - self._began
        self._began = None
        self.total += elapsed
        spent, own, credit = self._charge(elapsed)
        if self._follows and not self._chosen:
            self._after = spent
        if self._step >= WARMUP_STEPS and (self._chosen or self._follows):
            self.measured[0] += 1 if self._chosen else 0
            self.measured[1] += spent
        if not self._chosen:
            self.skipped[0] += 1
            self.skipped[1] += elapsed
            if self._typical is None or not self._follows:  # the first one teaches it whatever came before
                self._learn(own, 0.1)
        if self.budget is not None and self._step >= WARMUP_STEPS:  # the warm-up is free
            self._credit = credit
        self.own += spent
        self.largest = max(self.largest, spent)
        self._spent = 0.0

    def _learn(self, seconds: float, weight: float) -> None:
        """Move the typical time of a step left alone toward `seconds` (what one took) by `weight` (the first one
        sets it). A slower step moves it as one `SLOWER` times the typical would: a pause, a busy machine or a
        garbage collection are not what a step takes, and a yardstick they inflated would undercharge every
        measured step (what it takes beyond the typical); a faster one moves it all the way."""
        typical = self._typical
        self._typical = seconds if typical is None else typical + weight * (min(seconds, SLOWER * typical) - typical)

    def _charge_closing(self) -> None:
        """Charge what hookscope did since the last step `end`ed (closing its row) to that step."""
        closing, self._spent = self._spent, 0.0
        self.own += closing
        self.largest = max(self.largest, closing)
        if self._chosen and self._step >= WARMUP_STEPS:
            self.measured[1] += closing
        if self.budget is not None and self._step >= WARMUP_STEPS:  # the warm-up is free
            self._credit -= closing

    def _charge(self, elapsed: float) -> tuple[float, float, float]:
        """The open step, `elapsed` seconds after it began: what hookscope cost in it, its own time, and the credit
        left once it is settled."""
        spent, typical = self._spent, self._typical
        if (self._chosen or self._follows) and typical is not None:
            # what a measured step, and the step after it, took beyond a step left alone is the measuring's cost
            # too, timed or not: hooks traced into a compiled graph, torch's slower path for hooked modules, caches
            # the measuring emptied (a pause after it, an eval loop, say, counts as no more than `ENDS` typical steps)
            spent = max(spent, min(elapsed - typical, spent + ENDS * typical))
        # a pause between steps counts as no more than two typical steps
        own = elapsed - spent if typical is None else min(elapsed - spent, 2 * typical)
        # earn a share of the step's own time, spend what hookscope took; a cheap stretch is not banked
        earned = (self.budget or 0.0) * own
        return spent, own, min(self._credit + earned - spent, earned)

    def state_dict(self) -> dict[str, Any]:
        """What the budget learned and counted over the run so far (JSON), to resume it (`load_state_dict`)."""
        return {
            "steps": self.steps,
            "own": self.own,
            "total": self.total,
            "measured": list(self.measured),
            "skipped": list(self.skipped),
            "largest": self.largest,
            "typical": self._typical,
            "credit": self._credit,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from what `state_dict` returned (checked by the caller): the counts go on, the typical step time
        and the credit are kept (the steps go on from their own numbers: a resumed run has no new warm-up)."""
        self.steps, self.own, self.total = int(state["steps"]), float(state["own"]), float(state["total"])
        self.measured = [int(state["measured"][0]), float(state["measured"][1])]
        self.skipped = [int(state["skipped"][0]), float(state["skipped"][1])]
        self.largest, self._credit = float(state["largest"]), float(state["credit"])
        self._typical = None if state["typical"] is None else float(state["typical"])

    def summary(self) -> dict[str, Any]:
        """What was measured, for `WatchResults.meta["measured"]` (JSON): the steps that began, the budget (or
        `every`), hookscope's time over the rest of the steps' time (`cost`: 0.03 is 1.03 times the bare step; `None`
        before a step ends), the two in seconds (`seconds`: `own` and the steps' `total`, hookscope's included) and
        what one measured step costs against one left alone (`step_cost`)."""
        summary: dict[str, Any] = {"steps": self.steps}
        summary |= {"budget": self.budget} if self.budget is not None else {"every": self.every}
        spent, bare = self.own, self.total - self.own  # over the steps that ended
        summary["cost"] = spent / bare if bare > 0 else None  # watched time over bare time, less 1
        summary["seconds"] = {"own": spent, "total": self.total}
        (measured, own), (skipped, seconds) = self.measured, self.skipped
        # what one measured step costs against a step hookscope left alone (every step measured: 1 + this)
        summary["step_cost"] = own / measured / (seconds / skipped) if measured and skipped and seconds else None
        summary["after_warmup"] = {"measured": measured, "seconds": own, "largest": self.largest}
        return summary
