"""The step of one watch: `Stepper`, the one object that writes its `StepState` (`_step.py`), by applying the
step rule (`hookscope.callbacks._steps`) to the events of the training loop.

Everyone else reads the state: the recorder's hooks (which row a call is recorded into, or whether it is only
checked), the traced hooks under `torch.compile` (two booleans, so compiled code is reused), and `Watch`. The
stepper opens a step at a training batch (or at a closure's optimizer step), closes it when the next one opens or
the run ends, moves closed steps to the host store and the sinks (`flush`), and runs the live doctor.
"""

from __future__ import annotations

import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn as nn

from .._errors import UnobservedModuleWarning
from ..callbacks._budget import Budget, later_part
from ..callbacks._steps import Frame
from ..results._nonfinite import first_nonfinite, merge_first
from ..results._results import WatchResults
from ._assemble import build_results
from ._extras import collect_extras
from ._losses import LossLog
from ._options import WatchOptions
from ._recorder import Recorder
from ._scaler import GradScalerSteps
from ._sinks import Sink
from ._step import StepState
from ._store import SeriesStore

__all__ = ["Stepper"]


class StepSkipper(Protocol):
    """What lets the steps of a stretch pass without an event: the watch's own loop driver (`LoopDriver`)."""

    steps_to_skip: int
    marked: float | None

    def skip_steps(self, count: int, mark: int = -1) -> None: ...


_COUNTERS = ("batches", "optimizer_steps", "step", "recorded")

UNOBSERVED_AFTER = 3
"""Recorded steps after which a selected module that never ran is warned about (the end of a shorter run warns
too): a module skipped by the first step alone (a branch taken later, a forward of another thread that closed the
step before this one reached it) is no finding."""

LOSS_STEPS_PER_STEP = 64
"""Steps whose logged loss is kept on the host per measured step kept (`capacity`): the loss of every step is
three numbers, a measured step thousands."""


class Stepper:
    """Open and close the steps of one watch, and keep what the closed steps recorded.

    Args:
        options: The watch's options.
        sinks: Where flushed steps go, in order.
        lock: The watch's lock (hooks and events from several threads run one at a time).
        results: Returns the watch's results so far (for the live doctor).
    """

    def __init__(
        self,
        options: WatchOptions,
        sinks: list[Sink],
        lock: threading.RLock,
        results: Callable[[], WatchResults],
    ) -> None:
        self.state = StepState()
        self.options = options
        self.sinks = sinks
        self.store = SeriesStore(options.capacity, options.cadence)
        self.budget = Budget(options.budget if options.is_budgeted else None, options.cadence, options.max_steps)
        self.losses = LossLog(None if options.capacity is None else LOSS_STEPS_PER_STEP * options.capacity)
        self.recorder: Recorder | None = None
        self.scaler: GradScalerSteps | None = None
        self.first: dict[str, Any] = {"forward": None, "backward": None}  # from the flushed steps
        self._optimizer: weakref.ref[torch.optim.Optimizer] | None = None
        self._model: weakref.ref[nn.Module] | None = None
        self._lock = lock
        self._results = results
        self._warned_unobserved = False
        self._doctor: Any = None
        self._doctor_at = 0
        self._has_doctor = options.doctor
        self.dormancy: Callable[[bool, bool], bool] | None = None  # the watch's: leave the model alone until the
        # next optimizer step (`True`; the second argument: still follow its batches) or follow it again
        # (`False`), returning whether it is left alone; set when its own loop driver drives it
        self.is_dormant = False  # the model is left alone until the next optimizer step
        self.follows_batches = True  # the loop driver's forward pre-hook opens the steps (off only while dormant)
        self._loss_order: str | None = None  # where losses are logged: "after" or "before" their step's optimizer
        # step, or "mixed"; learned while batches are followed, so that their steps are known without following them
        self._unplaced: list[tuple[int, torch.Tensor]] = []  # losses logged while batches were not followed and
        # their order was not known yet: (optimizer steps done then, value)
        self._seen_whole = False  # every loss logged between two optimizer steps was seen at least once
        self._stretch = (0, 0)  # (first step, count) of the steps left alone followed by a count alone
        self._stretch_left = 0  # the steps of the stretch not counted yet
        self._later = 0  # its last steps, timed apart by the skipper (0: none)
        self.skipper: StepSkipper | None = None  # the watch's own loop driver: it lets the steps of a stretch
        # pass without an event, but the last
        self._followed_since = False  # the batches are followed since the last optimizer step
        self._checks_skipped = options.checks_skipped_steps

    # ---- what the stepper follows ----------------------------------------------------------------------------
    def bind(self, recorder: Recorder, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """Follow the steps of `model` trained by `optimizer`, recorded by `recorder` (a new one: a new store)."""
        if self.recorder is not None and recorder is not self.recorder:
            self.store = SeriesStore(self.options.capacity, self.options.cadence)
        self.recorder = recorder
        self.is_dormant, self.follows_batches = False, True  # the hooks of a new attachment are all on the model
        self._loss_order, self._seen_whole, self._followed_since = None, False, False  # perhaps another loop
        self._stretch, self._stretch_left, self._later = (0, 0), 0, 0
        self.skipper = None  # set by `Watch.attach` for its own driver, after this
        self._model = weakref.ref(model)
        self._optimizer = None if optimizer is None else weakref.ref(optimizer)

    def set_optimizer(self, optimizer: torch.optim.Optimizer, *, after_step: bool) -> None:
        """Count steps by `optimizer`'s steps from now on (see `Watch.attach_optimizer`)."""
        state = self.state
        self._optimizer = weakref.ref(optimizer)
        state.optimizer_steps = max(state.step, 0) + (1 if after_step and state.step >= 0 else 0)

    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer whose steps are the steps (`None`: each training forward is one)."""
        return None if self._optimizer is None else self._optimizer()

    def model(self) -> nn.Module | None:
        """The watched model, if it is alive."""
        return None if self._model is None else self._model()

    def is_ours(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether `optimizer`'s steps are the watched steps."""
        return self._optimizer is None or self._optimizer() is optimizer

    # ---- events ----------------------------------------------------------------------------------------------
    def batch_started(self) -> None:
        """A training batch begins: open (or continue) its step; traced hooks follow the open step."""
        state = self.state
        state.batches += 1
        if self.is_dormant:  # left alone until the next optimizer step: open its step, nothing else
            self._ensure_step()
            state.recording = state.checking_now = False
            state.skipping = True
            return
        self.poll_scaler()
        self._ensure_step()
        state.recording, state.checking_now = state.row >= 0, state.row < 0 and state.checking
        state.skipping = state.row < 0 and not state.checking
        if self.recorder is not None and self.recorder.is_awake == state.skipping:
            with self.budget.timed():  # off for a step left alone, on again for one measured or checked
                self.recorder.set_awake(not state.skipping)

    def batch_ended(self) -> None:
        """The training batch ended: hooks record nothing until the next one."""
        self.state.recording = self.state.checking_now = self.state.skipping = False

    def backward_ended(self) -> None:
        """A backward through the model finished: keep its loss scale, take the parameter gradients now without an
        optimizer, or after the first backward of a closure that the optimizer's step runs."""
        recorder, state = self.recorder, self.state
        if recorder is None:
            return
        state.backwards += 1
        if state.row < 0 and self.scaler is None:  # a step not measured: no parameter work
            return
        with self.budget.timed():  # the parameters' work is hookscope's cost too
            if self.scaler is not None:
                recorder.set_grad_factor(self.scaler.factor())
            if self._optimizer is None:
                recorder.params.record_grads()
            elif state.in_optimizer_step and not state.closure_grads:
                state.closure_grads = True
                recorder.params.record_grads()

    def optimizer_step_starting(self, optimizer: torch.optim.Optimizer) -> None:
        """Open the step if it has not begun (a closure step), take the parameter gradients, copy the weights."""
        recorder = self.recorder
        if recorder is None or not self.is_ours(optimizer):
            return
        if self._optimizer is not None:
            self._ensure_step()
        self.state.in_optimizer_step, self.state.closure_grads = True, False
        if self.state.row < 0:  # a step not measured: no parameter work
            return
        with self.budget.timed():
            recorder.params.record_grads()
            recorder.params.snapshot()

    def optimizer_step_ended(self, optimizer: torch.optim.Optimizer) -> None:
        """Record the update ratios and count the step."""
        if self._stretch_left:  # a stretch of steps left alone: count the step, nothing else
            if self.is_ours(optimizer):
                self._count_stretch(self._stretch_left - self._steps_to_skip() if self.skipper is not None else 1)
            return
        recorder = self.recorder
        if recorder is None or not self.is_ours(optimizer):
            return
        if not self.follows_batches:
            self._step_left_alone_ended()
            return
        self.state.in_optimizer_step = False
        if self.state.row >= 0 or recorder.params.is_snapshot_pending:
            with self.budget.timed():
                recorder.params.record_ratios()
                recorder.params.record_settings(optimizer)
        self.state.optimizer_steps += 1
        if self.scaler is not None:
            self.scaler.stepped = True
        elif self.dormancy is not None and not self._checks_skipped:
            self.budget.end()  # steps are timed from one optimizer step to the next
            self._decide_next_step()

    def _step_left_alone_ended(self) -> None:
        """The optimizer step of a step whose batches were not followed ended: that step is counted (it began
        when the step before it ended), and the next one decided."""
        state, budget = self.state, self.budget
        step = state.optimizer_steps
        self.end_step()  # the measured step before it, still open for a loss logged after its optimizer step
        budget.begin(step)
        state.batches += 1  # not seen: one batch a step
        state.optimizer_steps = step + 1
        budget.end()
        if self.losses.is_full:
            with budget.timed():
                self.losses.take()
        self._decide_next_step()

    def _count_stretch(self, ended: int) -> None:
        """`ended` more steps of the stretch ended: count them (the losses logged next go that many steps
        further); at the stretch's end, count its time (`Budget.stretch_ended`) and decide the next step."""
        state = self.state
        state.optimizer_steps += ended
        state.batches += ended  # not seen: one batch a step
        state.step += ended
        self._stretch_left -= ended
        if not self._stretch_left:
            marked = self.skipper.marked if self.skipper is not None and self._later else None
            later = None if marked is None else (time.perf_counter() - marked, self._later)
            self.budget.stretch_ended(*self._stretch, later)
            self._decide_next_step()

    def _steps_to_skip(self) -> int:
        return self.skipper.steps_to_skip if self.skipper is not None else 0

    def catch_up(self) -> None:
        """Count the steps of a stretch that the loop driver let pass since they were last counted (before a
        loss is placed, the counts are read or saved): the driver counts them, the state is brought up to it."""
        if self._stretch_left and self.skipper is not None:
            ended = self._stretch_left - 1 - self.skipper.steps_to_skip  # the stretch's last step has its event
            if ended:
                self._count_stretch(ended)

    @property
    def batches(self) -> int:
        """The training batches begun over the run (`StepState.batches`, with the steps of a stretch that passed
        counted): the run's count that its loop drivers follow (`Watch.batch_count`)."""
        self.catch_up()
        return self.state.batches

    def settle_stretch(self) -> None:
        """Count the time of the steps of the stretch that ended so far (the run ends, or its results are read)."""
        self.catch_up()
        first, count = self._stretch
        done = count - self._stretch_left
        if self._stretch_left and done:
            self.budget.stretch_ended(first, done)
            self._stretch, self._later = (first + done, self._stretch_left), 0

    def _decide_next_step(self) -> None:
        """The step is done: decide the next one now, and leave the model alone until then if it is not measured.
        Where the loop's losses are known to be logged on one side of the optimizer step, its batches are not
        followed either (the driver's forward pre-hook is paused too), and the step a loss belongs to is set here.
        """
        state, followed, was_dormant = self.state, self.follows_batches, self.is_dormant
        self._seen_whole = self._seen_whole or self._followed_since
        dormant = not self.budget.decide(state.optimizer_steps)
        # the batches stay followed until the losses logged between two optimizer steps were all seen once (so that
        # losses on both sides of the optimizer step are found "mixed"), and in a loop that logs them on both sides
        batches = not dormant or not self._seen_whole or self._loss_order == "mixed" or bool(self._unplaced)
        if (dormant, batches) != (self.is_dormant, self.follows_batches):
            with self.budget.timed():
                self.is_dormant = self.dormancy(dormant, batches) if self.dormancy is not None else False
            self.follows_batches = batches or not self.is_dormant
        self._followed_since = self.follows_batches
        if not (followed and self.follows_batches):  # no forward opened this step or will open the next one: the
            # losses logged from now on go where their order says
            if self._loss_order == "before":
                self.end_step()  # its loss came before its optimizer step
                state.step, state.is_open = state.optimizer_steps, False
            else:
                state.step = state.optimizer_steps - 1
            if was_dormant and self.is_dormant:  # no step after a measured one in a stretch: each is timed alone
                count = self.budget.stretch(state.optimizer_steps)
                if count > 1:
                    self._stretch, self._stretch_left = (state.optimizer_steps, count), count
                    # its later half is timed apart: the steps right after a measured one are slower (caches refilled)
                    self._later = later_part(count)
                    if self.skipper is not None:
                        self.skipper.skip_steps(count - 1, self._later - 1)  # the last one's event ends the stretch

    def frame_began(self, frame: Frame) -> None:
        """A root forward that is not part of a step began: traced (compiled) hooks record nothing during it."""
        if self.recorder is not None and frame.reason is not None:
            state = self.state
            frame.saved = (state.recording, state.checking_now, state.skipping)
            state.recording = state.checking_now = state.skipping = False

    def frame_ended(self, frame: Frame, completed: bool) -> None:
        """A root forward ended (after `Recorder.commit` kept what it recorded): the flags set aside for it come
        back; one that raised was no training batch (without an optimizer, the step it began goes on with the next
        forward)."""
        if self.recorder is None:
            return
        with self._lock:
            if frame.saved is not None:
                self.state.recording, self.state.checking_now, self.state.skipping = frame.saved
            if not completed and frame.reason is None:
                self.state.batches -= 1

    def log_loss(self, loss: torch.Tensor | float) -> None:
        """The loss of the open step, measured or not: into the loss log (every step), and into the open row when
        the step is measured. A loss logged before any step began is counted in `dropped["outside_step"]`."""
        recorder, state = self.recorder, self.state
        if recorder is None:
            return
        value = loss.detach().double().mean() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))
        self.catch_up()
        if not self.follows_batches and self._loss_order is None:
            self._unplaced.append((state.optimizer_steps, value))  # placed once the order is learned
            return
        if state.step < 0:
            recorder.drop("outside_step")
            return
        if self.follows_batches and self._optimizer is not None:
            self._learn_loss_order(state.optimizer_steps > state.step)
        self.losses.add(state.step, value)
        recorder.add_loss(value)

    def _learn_loss_order(self, after: bool) -> None:
        """A loss of the open step was logged `after` its optimizer step (or before it): learn the loop's order,
        and place the losses logged while it was not known (a loss logged between the optimizer steps of steps
        `t - 1` and `t` is step `t - 1`'s when losses come after, step `t`'s when they come before)."""
        order = "after" if after else "before"
        if self._loss_order is None:
            self._loss_order = order
            for steps_done, value in self._unplaced:
                self.losses.add(steps_done - 1 if after else steps_done, value)
            self._unplaced = []
        elif self._loss_order != order:
            self._loss_order = "mixed"

    def label(self, label: str) -> None:
        """Label the open step (`"retain_graph"`: a backward went through its forward twice)."""
        state = self.state
        if state.step >= 0 and [label, state.step] not in state.labelled:
            state.labelled.append([label, state.step])

    def poll_scaler(self) -> None:
        """After `scaler.update()`: if the open step had no optimizer step, the scaler skipped it; it is a step
        of its own (recorded with its forward and output gradients, no parameter gradients or update ratios)."""
        tracker, state = self.scaler, self.state
        if tracker is None or not tracker.updated():
            return
        if not tracker.stepped and state.step >= 0 and state.step == state.optimizer_steps:
            state.skipped.append(state.step)
            state.optimizer_steps += 1
        tracker.stepped = False

    # ---- steps -----------------------------------------------------------------------------------------------
    def _ensure_step(self) -> None:
        """Open the step the next event belongs to: the optimizer's next step, or this training forward's."""
        state = self.state
        if self.recorder is None:
            return
        step = state.optimizer_steps if self._optimizer is not None else state.batches - 1
        if step != state.step or not state.is_open:
            self._begin_step(step)

    def is_step_done(self) -> bool:
        """Whether the open step has had its optimizer step (or, without an optimizer, its backward)."""
        if self._optimizer is not None:
            return self.state.optimizer_steps > self.state.step
        return self.state.backwards > 0

    def _begin_step(self, step: int) -> None:
        self.end_step()
        recorder, state = self.recorder, self.state
        if recorder is None:
            return
        state.step, state.backwards, state.is_open = step, 0, True
        if recorder.buffers.is_full:
            self.flush()  # first: thinning may change which steps are recorded
        elif self.losses.is_full:
            with self.budget.timed():
                self.losses.take()
        if self.budget.begin(step) and self.store.records(step):
            state.row = recorder.buffers.new_row(step)
            state.recorded += 1
        else:
            state.checking = self._checks_skipped

    def end_step(self) -> None:
        """Close the open step, if any: fold its checks, or settle its row and run the doctor when it is due."""
        recorder, state = self.recorder, self.state
        if recorder is None or (state.row < 0 and not state.checking):
            state.skipping = False
            return
        with self.budget.timed():
            self._close_step(recorder, state)

    def _close_step(self, recorder: Recorder, state: StepState) -> None:
        if state.checking:
            recorder.fold_flags(state.step)
        was_recorded = state.row >= 0
        if was_recorded:
            recorder.settle()
        state.row = -1
        state.checking = state.recording = state.checking_now = state.skipping = state.is_open = False
        if was_recorded:
            self._warn_unobserved()
            if self._has_doctor and state.recorded - self._doctor_at >= self.options.doctor_every:
                self._run_doctor()

    def finish(self, error: BaseException | None) -> None:
        """The run ended (with `error`, if it raised): close the open step, flush, warn about unobserved modules."""
        if error is not None:
            self._warned_unobserved = True  # a step cut short proves nothing about unobserved modules
        self.poll_scaler()
        self.settle_stretch()
        if self._unplaced:  # the order was never learned: as most loops do, after the optimizer step
            self._learn_loss_order(True)
        state = self.state
        is_open = self.recorder is not None and (state.row >= 0 or state.checking)
        if is_open and self._optimizer is not None and state.optimizer_steps <= state.step:
            self.label("unfinished")  # its optimizer step never came: the run ended, or forwards ran after it
        self.end_step()
        self.flush()
        self.budget.settle()
        self._warn_unobserved(final=True)

    def flush(self) -> None:
        """Move the closed steps' rows to the host store (one transfer) and hand them to the sinks."""
        recorder = self.recorder
        if recorder is None:
            return
        with self.budget.timed():
            self._flush(recorder)

    def _flush(self, recorder: Recorder) -> None:
        self.losses.take()
        stop = self.state.row if self.state.row >= 0 else None
        first = recorder.buffers.first_id
        chunk = recorder.buffers.take(stop)
        if chunk is None:
            return
        orders = (recorder.forward_order, recorder.backward_order)
        calls = recorder.call_log.take(range(first, first + len(chunk)))
        self.first = merge_first(self.first, first_nonfinite(chunk, recorder.paths, orders, calls))
        kept = self.store.add(chunk)
        if self.sinks and len(kept):
            block = build_results(
                kept, recorder.paths, recorder.kinds, recorder.param_names, self.options, recorder.residual.paths
            )
            for sink in self.sinks:
                sink.write(block)

    # ---- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The counters, labels, first non-finite values and kept steps (the table as `Chunk` fields)."""
        self.settle_stretch()  # the budget's counts include the steps of a stretch that ended so far
        state = self.state
        saved: dict[str, Any] = {name: getattr(state, name) for name in _COUNTERS}
        saved.update(warned_unobserved=self._warned_unobserved, skipped=list(state.skipped))
        saved.update(labelled=[list(pair) for pair in state.labelled], first=dict(self.first))
        saved.update(stride=self.store.stride, capacity_dropped=self.store.dropped, table=self.store.table())
        saved["losses"] = self.losses.state_dict()
        saved["budget"] = self.budget.state_dict()
        return saved

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (checked by the caller: nothing here refuses it)."""
        state = self.state
        for name in _COUNTERS:
            setattr(state, name, saved[name])
        state.skipped = list(saved.get("skipped", ()))
        state.labelled = [list(pair) for pair in saved.get("labelled", ())]
        self._warned_unobserved = saved["warned_unobserved"]
        self.first = dict(saved["first"])
        self.store.restore(saved["table"], saved["stride"], saved["capacity_dropped"])
        if "losses" in saved:  # states saved before every step's loss was kept have none
            self.losses.load_state_dict(saved["losses"])
        if "budget" in saved:  # nor those saved before the budget was kept
            self.budget.load_state_dict(saved["budget"])

    # ---- warnings and the doctor -----------------------------------------------------------------------------
    def _warn_unobserved(self, final: bool = False) -> None:
        recorder = self.recorder
        if self._warned_unobserved or recorder is None or self.state.recorded == 0:
            return
        if not final and (self.state.recorded < UNOBSERVED_AFTER or not any(recorder.observed)):
            return
        self._warned_unobserved = True
        unobserved = collect_extras(recorder, model=self.model(), unobserved_only=True).unobserved
        if unobserved:
            listing = "; ".join(f"{path!r}: {reason}" for path, reason in unobserved.items())
            warnings.warn(
                f"watch(): {len(unobserved)} selected module(s) never ran during a training step, so nothing is "
                f"recorded for them (see results().unobserved): {listing}",
                UnobservedModuleWarning,
                stacklevel=2,
            )

    def _run_doctor(self) -> None:
        self._doctor_at = self.state.recorded
        if self._doctor is None:
            try:
                from ..doctor import LiveDoctor
            except ImportError:  # the doctor is an optional part: watch works without it
                self._has_doctor = False
                return
            self._doctor = LiveDoctor()
        self._doctor.update(self._results(), warn=True, stacklevel=3)
