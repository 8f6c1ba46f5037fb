"""Progress of long work (a patching sweep, the forward of a large model's summary): one line on a terminal.

`ProgressLine` counts items done out of a total and, where it may, draws them with rich (a bar, `done/total`,
the elapsed and remaining time) on stderr, in place, cleared when the work ends (also when it raises). Whether it
draws is decided when the work starts: never with `enabled=False`; with `enabled=None` (the default of every
`progress=` argument) only when stderr is a terminal and rich is installed, so notebooks, CI logs and pipes stay
clean; with `enabled=True` wherever rich can draw (rich's own display in a notebook, plain redraws in a log), and
a warning says why not when rich is missing. Nothing is drawn before the work has run `delay` seconds (short
work never flickers, never imports rich), then at most every `interval` seconds. Counting is a few Python
operations, with no host-device sync; a failure to draw only stops the drawing, never the work.
"""

from __future__ import annotations

import importlib.util
import sys
import time
import warnings
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

from ._errors import HookscopeWarning

__all__ = ["DELAY", "INTERVAL", "ProgressLine", "is_terminal"]

DELAY = 0.5
"""Seconds of work before the first drawing, unless a `ProgressLine` is given its own `delay`."""
INTERVAL = 0.25
"""The fewest seconds between two drawings, unless a `ProgressLine` is given its own `interval`."""


def is_terminal(*streams: Any) -> bool:
    """Whether every stream is a terminal (a stream without `isatty`, or whose `isatty` fails, is not)."""
    try:
        return all(bool(stream.isatty()) for stream in streams)
    except (AttributeError, ValueError, OSError):
        return False


def _has_rich() -> bool:
    """Whether rich can be imported, without importing it (short work never pays for the import)."""
    try:
        return importlib.util.find_spec("rich") is not None  # None too where sys.modules blocks it
    except (ImportError, ValueError):  # a broken install, or a module without a spec in sys.modules
        return False


class ProgressLine:
    """A context manager that shows `description ━━━╺━━━ done/total unit elapsed eta remaining` while the work runs.

    Args:
        description: What runs, e.g. `"patch"`.
        total: How many items the work has.
        unit: What an item is, e.g. `"cells"`.
        enabled: `None`: draw only on a terminal; `True`: draw wherever rich can; `False`: never.
        stream: Where to draw (default: `sys.stderr` when the work starts).
        delay: Seconds of work before the first drawing (`None`: `DELAY`).
        interval: The fewest seconds between two drawings (`None`: `INTERVAL`).
        clock: Seconds, monotonic (tests pass their own).
        stacklevel: The `stacklevel` of the warning that rich is missing, counted from `__enter__`.

    Example:
        >>> with ProgressLine("patch", total=3, unit="cells", enabled=False) as line:
        ...     for _ in range(3):
        ...         line.advance()
        >>> line.done
        3
    """

    def __init__(
        self,
        description: str,
        total: int,
        unit: str,
        *,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        delay: float | None = None,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        stacklevel: int = 2,
    ) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.done = 0
        self._enabled = enabled
        self._stream = stream
        self._delay = DELAY if delay is None else delay
        self._interval = INTERVAL if interval is None else interval
        self._clock = clock
        self._stacklevel = stacklevel
        self._is_active = False  # drawing wanted and still possible
        self._started_at = 0.0
        self._drawn_at = -float("inf")
        self._rich: Any = None  # (rich Progress, task id) once drawn

    def __enter__(self) -> ProgressLine:
        stream = self._stream if self._stream is not None else sys.stderr
        self._stream = stream
        self._is_active = self._enabled is True or (self._enabled is None and is_terminal(stream))
        if self._is_active and not _has_rich():
            self._is_active = False
            if self._enabled is True:
                warnings.warn(
                    "progress=True needs rich to draw the progress line, and it is not installed: pip install rich "
                    "(or 'hookscope[cli]'); the work runs without it",
                    HookscopeWarning,
                    stacklevel=self._stacklevel,
                )
        self._started_at = self._clock()
        return self

    def advance(self, count: int = 1) -> None:
        """Count `count` more items done; draw them if the line is due."""
        self.done += count
        if not self._is_active:
            return
        now = self._clock()
        if now - self._started_at < self._delay or now - self._drawn_at < self._interval:
            return
        self._drawn_at = now
        try:
            self._draw()
        except Exception:  # the line is a courtesy: a stream that fails stops the drawing, never the work
            self._is_active = False

    def _draw(self) -> None:
        if self._rich is None:
            self._rich = self._start()  # draws the first time
            return
        progress, task = self._rich
        progress.update(task, completed=self.done, elapsed=self._elapsed())
        progress.refresh()

    def _elapsed(self) -> str:
        """The time since the work started (not since the first drawing), as `H:MM:SS`."""
        seconds = int(max(self._clock() - self._started_at, 0.0))
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"

    def _start(self) -> tuple[Any, Any]:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        # The terminal was checked above (or the user asked for the line): rich's own guess from environment
        # variables must not overrule it. In a notebook rich still uses its own display.
        console = Console(file=self._stream, force_terminal=True)
        columns = (
            TextColumn("[bold]{task.description}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(self.unit),
            TextColumn("{task.fields[elapsed]}", style="progress.elapsed"),
            TextColumn("eta"),
            TimeRemainingColumn(),
        )
        # While the line is shown, rich sends prints through it (they appear above the line, not through it): those
        # to stderr when the line is on stderr, those to stdout only when stdout is a terminal too (a stdout
        # redirected to a file keeps every print).
        on_stderr = self._stream is sys.stderr
        progress = Progress(
            *columns,
            console=console,
            auto_refresh=False,
            transient=True,
            get_time=self._clock,  # the remaining time is estimated on the same clock as the rest
            redirect_stdout=on_stderr and is_terminal(sys.stdout),
            redirect_stderr=on_stderr,
        )
        task = progress.add_task(self.description, total=self.total, completed=self.done, elapsed=self._elapsed())
        progress.start()
        return progress, task

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        """Clear the line (rich gives the redirected stdout and stderr back), whether the work ended or raised."""
        self._is_active = False
        if self._rich is not None:
            (progress, task), self._rich = self._rich, None
            try:
                progress.update(task, completed=self.done, elapsed=self._elapsed())  # rich draws once more, then clears
                progress.stop()
            except Exception:  # a stream that fails on clearing must not hide the work's own result or error
                pass
