"""Names and text made safe and short for display: the one rule that plots, the report and every table use.

Names come from users' models and files, so they may hold anything: bidi controls, lone surrogates, 20,000
characters. `neutralize` makes every character visible and encodable. `shorten_path` fits a dotted path into a
width by dropping whole middle segments (`encoder.…self_attention.query`), `shorten_middle` cuts the middle out
of any name, `shorten_end` cuts the end of a value such as a shape; none of them cuts through a number when it
can help it. `display_name` neutralizes and shortens a module path and names the root `(root)`; `quoted` is how
running text shows one; `wrap` wraps messages, shortening words too long for a line. Only what is shown is
shortened: results, saved data and findings keep the full names. `terminal_width` is the default width.
"""

from __future__ import annotations

import re
import shutil
import textwrap
import unicodedata

from ._check import checked

__all__ = [
    "ELLIPSIS", "ROOT", "display_name", "neutralize", "quoted", "shorten_end", "shorten_middle", "shorten_path",
    "strip_terminal_codes", "terminal_width", "wrap",
]  # fmt: skip

ELLIPSIS = "…"
ROOT = "(root)"
"""How the root module (path `""`) is shown."""
_DEFAULT_WIDTH = 100
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


_TERMINAL_CODE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def strip_terminal_codes(text: str) -> str:
    """Return `text` without terminal escape sequences (colours, cursor moves, titles), as a terminal shows it.

    Error messages that libraries colour for the terminal (`\x1b[31m...\x1b[0m`) read as plain text elsewhere.

    >>> strip_terminal_codes("\x1b[1;31mValueError\x1b[0m: bad")
    'ValueError: bad'
    """
    return _TERMINAL_CODE.sub("", text)


@checked()
def neutralize(value: object) -> str:
    """Return `str(value)` with bidi controls and other control/format/surrogate characters shown as `<U+XXXX>`.

    The result is always encodable as UTF-8 (a lone surrogate becomes `<U+D800>`).

    >>> neutralize("rtl\\u202eevil")
    'rtl<U+202E>evil'
    """
    out = []
    for char in str(value):
        visible = char in "\t\n" or (char not in _BIDI and unicodedata.category(char) not in ("Cc", "Cf", "Cs"))
        out.append(char if visible else f"<U+{ord(char):04X}>")
    return "".join(out)


def _is_word(char: str) -> bool:
    return char.isalnum() or char in "_."


def _splits_number(text: str, at: int) -> bool:
    return 0 < at < len(text) and text[at - 1].isdigit() and text[at].isdigit()


def shorten_end(text: str, width: int, ellipsis: str = ELLIPSIS) -> str:
    """Cut `text` to `width` characters, ending with `ellipsis` where it was cut.

    The cut moves back to the start of a number or word it would split (`[2, 8, 1000]` at 10 -> `[2, 8, …`),
    unless that leaves less than half the width.

    Example:
        >>> shorten_end("{logits: [2, 8, 1000]}", 18)
        '{logits: [2, 8, …'
    """
    if len(text) <= width:
        return text
    if width <= len(ellipsis):
        return text[:width]
    keep = width - len(ellipsis)
    head = text[:keep]
    if _is_word(text[keep]) and head and _is_word(head[-1]):
        trimmed = head.rstrip("".join({c for c in head if _is_word(c)}))
        if len(trimmed) >= keep // 2:
            head = trimmed
    return head + ellipsis


def shorten_middle(text: str, width: int, ellipsis: str = ELLIPSIS) -> str:
    """Cut the middle out of `text` so it fits `width` characters: `AdaptiveAvgPool2d` -> `Adapt…Pool2d`.

    A cut that would split a number moves to its edge (the number is dropped whole), unless one side would
    then keep less than half of its share.

    Example:
        >>> shorten_middle("block_123456789_tail", 16)
        'block_…_tail'
    """
    if len(text) <= width:
        return text
    if width <= len(ellipsis):
        return text[:width]
    keep = width - len(ellipsis)
    head, tail = (keep + 1) // 2, keep - (keep + 1) // 2
    start, end = head, len(text) - tail
    while _splits_number(text, start) and start > head // 2:
        start -= 1
    while _splits_number(text, end) and len(text) - end > tail // 2:
        end += 1
    if _splits_number(text, start) or _splits_number(text, end):
        start, end = head, len(text) - tail  # a number wider than the room: it has to be cut
    return text[:start] + ellipsis + text[end:]


def shorten_path(path: str, width: int, ellipsis: str = ELLIPSIS, sep: str = ".", keep_first: bool = True) -> str:
    """Shorten a dotted path to `width` characters, eliding whole segments first (numbers stay whole).

    The first segment and as many trailing segments as fit are kept (`encoder.…layers.3.mlp.fc1`); with
    `keep_first=False` only trailing segments (`…layers.3.mlp.fc1`), for paths whose head is shown elsewhere (the
    parent rows of a tree). A path whose last segment alone does not fit is cut in the middle of its characters.

    Example:
        >>> shorten_path("encoder.layers.11.attention.output.dense", 31)
        'encoder.…attention.output.dense'
        >>> shorten_path("encoder.layers.11.attention.output.dense", 30, keep_first=False)
        '…11.attention.output.dense'
    """
    if len(path) <= width:
        return path
    parts = path.split(sep)
    head = parts[0] + sep if keep_first and len(parts) > 2 else ""
    tail, kept = None, 0
    for keep in range(len(parts) - 1 - bool(head), 0, -1):
        candidate = head + ellipsis + sep.join(parts[-keep:])
        if len(candidate) <= width:
            tail, kept = candidate, keep
            break
    middle = shorten_middle(path, width, ellipsis)
    if tail is not None and (kept >= 2 or len(tail) >= width // 2 or not middle.endswith(sep + parts[-1])):
        return tail  # whole segments, unless one short segment is all that fits and a middle cut keeps it
    if tail is None and len(parts) > 1 and width > len(ellipsis) + 2 and not middle.endswith(sep + parts[-1]):
        return ellipsis + shorten_middle(parts[-1], width - len(ellipsis), ellipsis)
    return middle


def display_name(name: object, width: int | None = None) -> str:
    """Return a module path or parameter name as shown: neutralized, `(root)` for `""`, shortened to `width`.

    >>> display_name(""), display_name("a\\ud800b"), display_name("encoder.layers.11.self_attn.out_proj", 24)
    ('(root)', 'a<U+D800>b', 'encoder.…out_proj')
    """
    shown = neutralize(name) or ROOT
    return shown if width is None else shorten_path(shown, width)


def quoted(name: str, width: int | None = None) -> str:
    """A path as running text shows it: `display_name` in quotes, `(root)` unquoted; never split by `wrap`.

    >>> quoted("encoder.0"), quoted("")
    ("'encoder.0'", '(root)')
    """
    return repr(display_name(name, width)).replace(" ", "\u00a0") if name else ROOT


def wrap(text: str, width: int, first: str = "", indent: str = "") -> list[str]:
    """Wrap `text` into lines of at most `width` characters, at spaces; a word too long for a line (a path) is
    shortened in the middle (`shorten_path`). `first` starts the first line, `indent` the others.

    >>> wrap("gradient norm at 'encoder.layers.11.self_attn' is small", 28, " 1. ", "    ")
    [' 1. gradient norm at', "    'encoder.…11.self_attn'", '    is small']
    """
    room = max(width - max(len(first), len(indent)), 2 * len(ELLIPSIS) + 2)
    words = [word if len(word) <= room else shorten_path(word, room) for word in neutralize(text).split(" ")]
    wrapper = textwrap.TextWrapper(
        width=max(width, room), initial_indent=first, subsequent_indent=indent, break_long_words=False
    )
    wrapper.break_on_hyphens = False
    return wrapper.wrap(" ".join(words)) or [first.rstrip()]


def terminal_width(default: int = _DEFAULT_WIDTH) -> int:
    """The columns of the terminal (`COLUMNS` first), or `default` when there is no terminal."""
    columns = shutil.get_terminal_size((default, 24)).columns
    return max(columns, 16) if columns > 0 else default
