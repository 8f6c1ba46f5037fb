"""The progress line of long work: drawn with rich on a terminal only (or when asked), with the right counts, at
most every `interval` seconds after a `delay`, cleared at the end, also when the work raises; silent elsewhere."""

from __future__ import annotations

import doctest
import io
import sys
import types

import pytest

import hookscope._progress as progress_module
from fake_terminal import Terminal, counts, is_clear, screen
from hookscope._errors import HookscopeWarning
from hookscope._progress import ProgressLine, is_terminal


class Clock:
    """A clock the test moves by hand (multiples of 1/8 s: exact in binary)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(stream: io.StringIO, enabled: bool | None, items: int = 12, step: float = 0.125) -> ProgressLine:
    """Count `items`, one every `step` seconds, under a line with a 0.5 s delay and a 0.25 s interval."""
    clock = Clock()
    with ProgressLine("patch", items, "cells", enabled=enabled, stream=stream, clock=clock) as line:
        for _ in range(items):
            clock.now += step
            line.advance()
    return line


def test_the_screen_emulator_reads_what_it_must() -> None:
    """The oracle itself: a carriage return overwrites, erase-line clears, cursor-up goes back a line."""
    assert screen("abc\rX") == ["Xbc"]
    assert screen("abc\r\x1b[2K") == [""]
    assert screen("one\ntwo\r\x1b[1A\x1b[2K") == ["", "two"]
    assert is_clear("\x1b[31mred\x1b[0m\n\r\x1b[1A\x1b[2K")
    with pytest.raises(AssertionError, match="unexpected control"):
        screen("\x1b[3J")


def test_on_a_terminal_the_line_shows_the_counts_due_and_is_cleared_at_the_end() -> None:
    terminal = Terminal()
    line = _run(terminal, None)
    # Items at t = 0.125 k. Due: t >= 0.5 (the delay) and 0.25 s after the last drawing: k = 4, 6, 8, 10, 12;
    # rich draws the last count once more when the line stops, then clears it.
    assert counts(terminal.getvalue(), "cells") == [(4, 12), (6, 12), (8, 12), (10, 12), (12, 12), (12, 12)]
    assert line.done == 12
    assert is_clear(terminal.getvalue())


def test_short_work_draws_nothing() -> None:
    terminal = Terminal()
    _run(terminal, None, items=3)  # done at 0.375 s, before the 0.5 s delay
    assert terminal.getvalue() == ""


@pytest.mark.parametrize(("stream", "enabled"), [(io.StringIO(), None), (Terminal(), False), (io.StringIO(), False)])
def test_nothing_is_written_off_a_terminal_or_when_turned_off(stream: io.StringIO, enabled: bool | None) -> None:
    line = _run(stream, enabled)
    assert stream.getvalue() == "" and line.done == 12


def test_asked_for_the_line_is_drawn_off_a_terminal_too() -> None:
    log = io.StringIO()
    _run(log, True)
    assert counts(log.getvalue(), "cells")[0] == (4, 12) and is_clear(log.getvalue())


def test_the_default_stream_is_stderr_when_the_work_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(progress_module, "DELAY", 0.0)
    monkeypatch.setattr(progress_module, "INTERVAL", 0.0)
    with ProgressLine("summary", 2, "modules") as line:
        line.advance()
        line.advance()
    assert counts(terminal.getvalue(), "modules") == [(1, 2), (2, 2), (2, 2)] and is_clear(terminal.getvalue())
    assert sys.stderr is terminal  # rich gave the stream it redirected back


def test_the_line_is_cleared_when_the_work_raises() -> None:
    terminal = Terminal()
    clock = Clock()
    with pytest.raises(KeyError, match="boom"), ProgressLine("patch", 4, "cells", stream=terminal, clock=clock) as line:
        clock.now = 1.0
        line.advance()
        raise KeyError("boom")
    assert counts(terminal.getvalue(), "cells")[0] == (1, 4) and is_clear(terminal.getvalue())


class Broken(Terminal):
    def write(self, text: str) -> int:
        raise OSError("the terminal went away")


def test_a_stream_that_fails_stops_the_drawing_never_the_work() -> None:
    line = _run(Broken(), None)
    assert line.done == 12


def _without_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in sys.modules if name == "rich" or name.startswith("rich.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "rich", None)  # `import rich` raises ImportError; find_spec says None


def test_without_rich_nothing_is_drawn_and_asking_for_it_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_rich(monkeypatch)
    terminal = Terminal()
    line = _run(terminal, None)
    assert terminal.getvalue() == "" and line.done == 12
    with pytest.warns(HookscopeWarning, match=r"progress=True needs rich .* pip install rich") as caught:
        _run(terminal, True)
    assert terminal.getvalue() == "" and len(caught) == 1


@pytest.mark.parametrize(
    ("stream", "expected"),
    [(Terminal(), True), (io.StringIO(), False), (object(), False), (Broken(), True)],
)
def test_is_terminal(stream: object, expected: bool) -> None:
    assert is_terminal(stream) is expected


class Closed(Terminal):
    def isatty(self) -> bool:
        raise ValueError("I/O operation on closed file")  # what a closed stream's isatty() raises


def test_a_stream_whose_isatty_fails_is_not_a_terminal() -> None:
    assert is_terminal(Terminal()) and not is_terminal(Closed()) and not is_terminal(Terminal(), Closed())


def test_docstring_examples_run() -> None:
    result = doctest.testmod(progress_module)
    assert result.attempted > 0 and result.failed == 0


def test_off_a_terminal_counting_never_reads_the_clock() -> None:
    """Counting where nothing is drawn is one addition per call: the clock is read once, when the work starts."""
    reads: list[float] = []

    def clock() -> float:
        reads.append(0.0)
        return 0.0

    with ProgressLine("patch", 1000, "cells", stream=io.StringIO(), clock=clock) as line:
        for _ in range(1000):
            line.advance()
    assert line.done == 1000 and len(reads) == 1


def test_a_rich_module_without_a_spec_counts_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """`find_spec` raises ValueError for a module in `sys.modules` whose `__spec__` is None: nothing is drawn."""
    broken = types.ModuleType("rich")
    broken.__spec__ = None
    monkeypatch.setitem(sys.modules, "rich", broken)
    terminal = Terminal()
    assert _run(terminal, None).done == 12 and terminal.getvalue() == ""
