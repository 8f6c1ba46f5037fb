"""The step logic of `Watch`: which step the next event belongs to, opening and closing steps, labels, and what
a root forward recorded (kept when it completed); the rule itself is `hookscope.callbacks._steps`.

`WatchSteps` is the part of `Watch` that follows steps; `Watch` adds the options, the events and the reading.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from .._errors import UnobservedModuleWarning
from ..callbacks._steps import Frame
from ..hooks import HookErrors
from ..results import WatchResults, first_nonfinite, merge_first
from ._assemble import build_results
from ._extras import collect_extras
from ._options import WatchOptions
from ._recorder import Recorder
from ._scaler import GradScalerSteps
from ._sinks import Sink
from ._store import SeriesStore

__all__ = ["WatchSteps"]


class WatchSteps:
    """Open and close the steps of one watch (see `hookscope.callbacks._steps` for what a step is)."""

    options: WatchOptions
    errors: HookErrors
    sinks: list[Sink]
    _recorder: Recorder | None
    _store: SeriesStore
    _scaler: GradScalerSteps | None
    _optimizer_ref: weakref.ref[torch.optim.Optimizer] | None
    _model_ref: weakref.ref[Any] | None
    _lock: threading.RLock
    _batches: int
    _optimizer_steps: int
    _step: int
    _step_backwards: int
    _recorded: int
    _skipped: list[int]
    _labelled: list[list[Any]]
    _first: dict[str, Any]
    _warned_unobserved: bool
    _doctor: Any
    _doctor_at: int
    results: Callable[[], WatchResults]  # Watch.results

    def _finish(self, error: BaseException | None) -> None:
        if error is not None:
            self._warned_unobserved = True  # a step cut short proves nothing about unobserved modules
        self._poll_scaler()
        recorder = self._recorder
        open_step = recorder is not None and (recorder.open_row >= 0 or recorder.checking)
        if open_step and self._optimizer_ref is not None and self._optimizer_steps <= self._step:
            self._label("unfinished")  # its optimizer step never came: the run ended, or forwards ran after it
        self._end_step()
        self._flush()
        self._warn_unobserved(final=True)

    def _frame_began(self, frame: Frame) -> None:
        """A root forward that is not part of a step began: traced (compiled) hooks record nothing during it."""
        recorder = self._recorder
        if recorder is not None and frame.reason is not None:
            frame.saved = (recorder.recording, recorder.checking_now)
            recorder.recording = recorder.checking_now = False

    def _frame_ended(self, frame: Frame, completed: bool) -> None:
        """A root forward ended: keep what it recorded if it completed (`Recorder.commit`); one that raised was
        no training batch (without an optimizer, the step it began goes on with the next forward)."""
        recorder = self._recorder
        if recorder is None:
            return
        with self._lock:
            if frame.saved is not None:
                recorder.recording, recorder.checking_now = frame.saved
            if frame.items:
                recorder.commit(frame, completed)
            if not completed and frame.reason is None:
                self._batches -= 1

    def _count_error(self, reason: str) -> None:
        if self._recorder is not None:
            self._recorder.drop(reason)

    def _label(self, label: str) -> None:
        """Label the open step (`"retain_graph"`: a backward went through its forward twice)."""
        if self._step >= 0 and [label, self._step] not in self._labelled:
            self._labelled.append([label, self._step])

    def _poll_scaler(self) -> None:
        """After `scaler.update()`: if the open step had no optimizer step, the scaler skipped it; it is a step
        of its own (recorded with its forward and output gradients, no parameter gradients or update ratios)."""
        tracker = self._scaler
        if tracker is None or not tracker.updated():
            return
        if not tracker.stepped and self._step >= 0 and self._step == self._optimizer_steps:
            self._skipped.append(self._step)
            self._optimizer_steps += 1
        tracker.stepped = False

    # ---- steps -----------------------------------------------------------------------------------------------
    def _ensure_step(self) -> None:
        """Open the step the next event belongs to: the optimizer's next step, or this training forward's."""
        recorder = self._recorder
        if recorder is None:
            return
        step = self._optimizer_steps if self._optimizer_ref is not None else self._batches - 1
        if step != self._step or (recorder.open_row < 0 and not recorder.checking):
            self._begin_step(step)

    def _is_step_done(self) -> bool:
        """Whether the open step has had its optimizer step (or, without an optimizer, its backward)."""
        if self._optimizer_ref is not None:
            return self._optimizer_steps > self._step
        return self._step_backwards > 0

    def _begin_step(self, step: int) -> None:
        self._end_step()
        recorder = self._recorder
        if recorder is None:
            return
        self._step = step
        self._step_backwards = 0
        recorder.step_open = True
        if recorder.buffers.is_full:
            self._flush()  # first: thinning may change which steps are recorded
        if self._store.records(step):
            recorder.open_row = recorder.buffers.new_row(step)
            recorder.begin(recorder.open_row)
            self._recorded += 1
        else:
            recorder.checking = self.options.check_nonfinite

    def _end_step(self) -> None:
        recorder = self._recorder
        if recorder is None or (recorder.open_row < 0 and not recorder.checking):
            return
        if recorder.checking:
            recorder.fold_flags(self._step)
        was_recorded = recorder.open_row >= 0
        if was_recorded:
            recorder.settle()
        recorder.open_row = recorder.row = -1
        recorder.checking = recorder.recording = recorder.checking_now = recorder.step_open = False
        if was_recorded:
            self._warn_unobserved()
            if self.options.doctor and self._recorded - self._doctor_at >= self.options.doctor_every:
                self._run_doctor()

    def _flush(self) -> None:
        """Move the closed steps' rows to the host store (one transfer) and hand them to the sinks."""
        recorder = self._recorder
        if recorder is None:
            return
        recorder.write_pending()
        stop = recorder.open_row if recorder.open_row >= 0 else None
        chunk = recorder.buffers.take(stop)
        if chunk is None:
            return
        orders = (recorder.forward_order, recorder.backward_order)
        self._first = merge_first(self._first, first_nonfinite(chunk, recorder.paths, orders))
        kept = self._store.add(chunk)
        if self.sinks and len(kept):
            block = build_results(kept, recorder.paths, recorder.kinds, recorder.param_names, self.options)
            for sink in self.sinks:
                sink.write(block)

    # ---- warnings and the doctor -----------------------------------------------------------------------------
    def _warn_unobserved(self, final: bool = False) -> None:
        if self._warned_unobserved or self._recorder is None or self._recorded == 0:
            return
        if not final and not any(self._recorder.observed):  # a step closed before its forwards ran (threads)
            return
        self._warned_unobserved = True
        model = None if self._model_ref is None else self._model_ref()
        unobserved = collect_extras(self._recorder, model=model, unobserved_only=True).unobserved
        if unobserved:
            listing = "; ".join(f"{path!r}: {reason}" for path, reason in unobserved.items())
            warnings.warn(
                f"watch(): {len(unobserved)} selected module(s) never ran during a training step, so nothing is "
                f"recorded for them (see results().unobserved): {listing}",
                UnobservedModuleWarning,
                stacklevel=2,
            )

    def _run_doctor(self) -> None:
        self._doctor_at = self._recorded
        if self._doctor is None:
            try:
                from ..doctor import LiveDoctor
            except ImportError:  # the doctor is an optional part: watch works without it
                self.options = _without_doctor(self.options)
                return
            self._doctor = LiveDoctor()
        self._doctor.update(self.results(), warn=True, stacklevel=3)


def _without_doctor(options: WatchOptions) -> WatchOptions:

    return replace(options, doctor=False)
