"""`hookscope run`'s status line: on a terminal, one line that updates in place while the script trains.

The line (`hookscope: Sequential step 120 · loss 0.3412 · no findings`) is drawn on stderr at most every
`interval` seconds, from the session's step events. The script's own output must stay readable, so while the line
is shown `sys.stdout` and `sys.stderr` are thin wrappers that clear the line before each write (the next step
draws it again); every other attribute is the real stream's. Nothing is drawn, and nothing is wrapped, unless
both stdout and stderr are terminals. The loss is read (a host sync) only when the line is drawn, and the findings
so far (`LiveDoctor` on `Watch.results()`) at most every `findings_every` seconds.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from .._progress import is_terminal
from .._text import neutralize
from ._session import WatchedModel

__all__ = ["StatusLine", "is_terminal"]

_CLEAR = "\r\x1b[K"


class _ClearingStream:
    """A text stream that clears the status line before each write; the rest is `stream`'s own."""

    def __init__(self, stream: TextIO, line: StatusLine) -> None:
        self._stream = stream
        self._line = line

    def write(self, text: str) -> int:
        self._line.clear()
        return self._stream.write(text)

    def writelines(self, lines: Any) -> None:
        self._line.clear()
        self._stream.writelines(lines)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class StatusLine:
    """The status line of `hookscope run`: `start()` before the script, `update(models)` after steps, `stop()`.

    Args:
        stream: Where the line is drawn (the real stderr).
        interval: The fewest seconds between two drawings.
        findings_every: The fewest seconds between two diagnoses of the results so far.
        clock: Seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        stream: TextIO,
        interval: float = 0.25,
        findings_every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._interval = interval
        self._findings_every = findings_every
        self._clock = clock
        self._drawn_at = -float("inf")
        self._diagnosed_at = clock()  # the first diagnosis waits `findings_every`: the first steps say little
        self._findings: dict[int, int] = {}  # id(model entry) -> findings so far
        self._doctors: dict[int, Any] = {}
        self._shown = False
        self._saved: tuple[TextIO, TextIO] | None = None

    def start(self) -> None:
        """Wrap `sys.stdout` and `sys.stderr` so the script's writes clear the line first."""
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _ClearingStream(sys.stdout, self)
        sys.stderr = _ClearingStream(sys.stderr, self)

    def stop(self) -> None:
        """Clear the line and give the script's streams back (wrappers kept by the script still work)."""
        self.clear()
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved
            self._saved = None

    def clear(self) -> None:
        """Remove the line from the terminal, if it is shown."""
        if self._shown:
            self._shown = False
            self._stream.write(_CLEAR)
            self._stream.flush()

    def update(self, models: Sequence[WatchedModel]) -> None:
        """Draw the line for `models` again, unless it was drawn less than `interval` seconds ago."""
        now = self._clock()
        if now - self._drawn_at < self._interval or not models:
            return
        self._drawn_at = now
        if now - self._diagnosed_at >= self._findings_every:
            self._diagnosed_at = now
            self._diagnose(models)
        text = " | ".join(self._describe(model) for model in models)
        width = max(shutil.get_terminal_size().columns - 1, 20)
        line = f"hookscope: {text}"
        self._stream.write(_CLEAR + (line if len(line) <= width else line[: width - 1] + "…"))
        self._stream.flush()
        self._shown = True

    def _describe(self, model: WatchedModel) -> str:
        parts = [f"{neutralize(model.name)} step {model.steps}"]
        if model.last_loss is not None:
            parts.append(f"loss {float(model.last_loss):.4g}")
        found = self._findings.get(id(model))
        if found is not None:
            parts.append("no findings" if not found else f"{found} finding{'s' if found > 1 else ''}")
        return " · ".join(parts)

    def _diagnose(self, models: Sequence[WatchedModel]) -> None:
        """Count the findings so far of each model (a failure leaves the count as it was: never the script's)."""
        from ..doctor import LiveDoctor

        for model in models:
            try:
                doctor = self._doctors.setdefault(id(model), LiveDoctor())
                doctor.update(model.watcher.results())
                self._findings[id(model)] = len(doctor.reported)
            except Exception:  # the status line is a courtesy: a failed diagnosis only leaves it out
                continue
