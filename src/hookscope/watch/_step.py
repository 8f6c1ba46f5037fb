"""`StepState`: where one watched run is, in one value: the open step, how it is recorded, and the counters that
number steps. `Stepper` (`_stepper.py`) is its one writer; the recorder's hooks and `Watch` read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["StepState"]


@dataclass
class StepState:
    """Where the watched run is: the open step, how it is recorded, and the counters that number steps.

    Written only by `Stepper`; read by the recorder's hooks and by `Watch`.
    """

    step: int = -1  # the open step (-1: none yet)
    batches: int = 0  # training batches begun
    optimizer_steps: int = 0  # the watched optimizer's steps, and the steps a GradScaler skipped
    backwards: int = 0  # backwards in the open step
    recorded: int = 0  # steps recorded so far
    row: int = -1  # the row id of the open recorded step (-1: the open step is not recorded)
    is_open: bool = False  # a step is open: recorded, checked, or skipped by sampling
    checking: bool = False  # the open step is unrecorded and its non-finite values are checked
    recording: bool = False  # inside a training batch of a recorded step (read by traced hooks)
    checking_now: bool = False  # inside a training batch of a checked step (read by traced hooks)
    skipping: bool = False  # inside a training batch of a step neither measured nor checked: hooks are off
    in_optimizer_step: bool = False  # between the optimizer's step pre- and post-hook (a closure runs there)
    closure_grads: bool = False  # parameter gradients were taken from a backward inside the optimizer's step
    skipped: list[int] = field(default_factory=list)  # steps the scaler skipped (non-finite gradients)
    labelled: list[list[Any]] = field(default_factory=list)  # [label, step]: steps labelled rather than merged
