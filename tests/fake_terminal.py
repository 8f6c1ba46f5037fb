"""A fake terminal for the tests of progress lines: a stream that says it is a terminal, and what a real one
would show after the text written to it (carriage returns, newlines, erase-line and cursor-up, colours dropped).

It shares nothing with rich or hookscope: a few lines that interpret the control sequences a one-line progress
display writes, and refuse any other.
"""

from __future__ import annotations

import io
import re

_TOKENS = re.compile(r"(\x1b\[[0-9;?]*[A-Za-z]|\r|\n)")
_SGR = re.compile(r"\x1b\[[0-9;]*m")


class Terminal(io.StringIO):
    """A text stream that is a terminal."""

    def isatty(self) -> bool:
        return True


def screen(text: str) -> list[str]:
    """The lines a terminal shows after `text` was written to it (trailing spaces dropped)."""
    lines, row, column = [""], 0, 0
    for token in _TOKENS.split(text):
        if not token:
            continue
        if token == "\r":
            column = 0
        elif token == "\n":
            row, column = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        elif token.startswith("\x1b["):
            argument, command = token[2:-1], token[-1]
            if command == "K":  # erase: to the end of the line (0 or nothing) or the whole line (2)
                lines[row] = "" if argument == "2" else lines[row][:column]
            elif command == "A":
                row = max(row - int(argument or 1), 0)
            elif command not in "mhl":  # colours; cursor shown / hidden
                raise AssertionError(f"unexpected control sequence {token!r}")
        else:
            line = lines[row].ljust(column)
            lines[row] = line[:column] + token + line[column + len(token) :]
            column += len(token)
    return [line.rstrip() for line in lines]


def is_clear(text: str) -> bool:
    """Whether a terminal shows nothing after `text`."""
    return not any(screen(text))


def counts(text: str, unit: str) -> list[tuple[int, int]]:
    """Every `done/total <unit>` drawn, in order (one per drawing of the line)."""
    plain = _SGR.sub("", text)
    return [(int(done), int(total)) for done, total in re.findall(rf"(\d+)/(\d+) {re.escape(unit)}\b", plain)]
