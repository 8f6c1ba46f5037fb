"""Names made safe and short for display: the one rule that plots, the report and terminal tables use.

Names come from users' models and files, so they may hold anything: bidi controls, lone surrogates, 20,000
characters. `neutralize` makes every character visible and encodable; `shorten` fits a name into a width by
dropping whole middle segments of a dotted path (`bert.….attention.self.query`), never cutting a number in two;
`display_name` does both and names the root module `(root)`. Only what is shown is shortened: results, saved
data and findings keep the full names. `terminal_width` is the width tables are fitted to by default.
"""

from __future__ import annotations

import shutil
import textwrap
import unicodedata

from ._check import checked

__all__ = [
    "ELLIPSIS", "MIN_WIDTH", "ROOT", "display_name", "neutralize", "quoted", "shorten", "terminal_width", "truncate",
    "wrap",
]  # fmt: skip

ELLIPSIS = "…"
ROOT = "(root)"
"""How the root module (path `""`) is shown."""
MIN_WIDTH = 8
"""The narrowest width `shorten` accepts."""
_DEFAULT_WIDTH = 100
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


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


def shorten(name: str, width: int, mark: str = ELLIPSIS) -> str:
    """Fit `name` into `width` characters, cutting in the middle; numbers are never cut in two.

    A dotted path keeps its first segment and as many whole last segments as fit, the segments between them
    replaced by `…`. A name whose last segment alone does not fit is cut inside, in the middle, with the cut
    moved off any run of digits (unless one number is wider than `width` itself).

    Args:
        name: The name (shown as is when it fits).
        width: The most characters the result may have (at least `MIN_WIDTH`).
        mark: What replaces the cut part (`"..."` where only ASCII may be written).

    Raises:
        ValueError: `width` is not an int >= `MIN_WIDTH`.

    >>> shorten("bert.encoder.layer.11.attention.self.query", 30)
    'bert.….11.attention.self.query'
    >>> shorten("block_123456789_tail", 16)
    'block_…_tail'
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < MIN_WIDTH:
        raise ValueError(f"width must be an int >= {MIN_WIDTH}, got {width!r}")
    if len(name) <= width:
        return name
    segments = name.split(".")
    if len(segments) > 1:
        kept = _keep_segments(segments, width, mark)
        if kept is not None:
            return kept
    return _cut_inside(name, width, mark)


def _keep_segments(segments: list[str], width: int, mark: str) -> str | None:
    """`first.….tail.segments` (or `….tail` when the first does not fit too), or None when no segment fits."""
    for head in (segments[0] + ".", ""):
        tail: list[str] = []
        room = width - len(head) - len(mark)
        for segment in reversed(segments[1:]):
            if len(segment) + 1 > room:
                break
            tail.insert(0, segment)
            room -= len(segment) + 1
        if tail:  # an ASCII "..." stands for the dots around it too
            left = head[:-1] if head and mark.startswith(".") else head
            return left + mark + ("" if mark.endswith(".") else ".") + ".".join(tail)
    return None


def _cut_inside(name: str, width: int, mark: str) -> str:
    keep = width - len(mark)
    left, right = (keep + 1) // 2, len(name) - keep // 2
    while left > 0 and name[left - 1].isdigit() and name[left].isdigit():
        left -= 1
    while right < len(name) and name[right - 1].isdigit() and name[right].isdigit():
        right += 1
    if left == 0 and right == len(name):  # one number wider than everything: it has to be cut
        left, right = (keep + 1) // 2, len(name) - keep // 2
    return name[:left] + mark + name[right:]


def truncate(text: str, width: int, mark: str = ELLIPSIS) -> str:
    """Cut `text` at its end to at most `width` characters (`mark` included), never inside a number: for values
    whose start matters most, such as shapes.

    >>> truncate("([2, 197, 768], {need_weights: False})", 14)
    '([2, 197, 768…'
    >>> truncate("([2, 197, 768], {need_weights: False})", 12)
    '([2, 197, …'
    """
    if len(text) <= width:
        return text
    end = max(width - len(mark), 0)
    while 0 < end < len(text) and text[end - 1].isdigit() and text[end].isdigit():
        end -= 1
    return text[:end] + mark


def display_name(name: object, width: int | None = None) -> str:
    """Return a module path or parameter name as shown: neutralized, `(root)` for `""`, shortened to `width`.

    >>> display_name(""), display_name("a\\ud800b")
    ('(root)', 'a<U+D800>b')
    """
    shown = neutralize(name) or ROOT
    return shown if width is None else shorten(shown, width)


def quoted(name: str, width: int | None = None) -> str:
    """A path as running text shows it: `display_name` in quotes, `(root)` unquoted; never split by `wrap`.

    >>> quoted("encoder.0"), quoted("")
    ("'encoder.0'", '(root)')
    """
    return repr(display_name(name, width)).replace(" ", "\u00a0") if name else ROOT


def terminal_width(default: int = _DEFAULT_WIDTH) -> int:
    """The columns of the terminal (`COLUMNS` first), or `default` when there is no terminal."""
    columns = shutil.get_terminal_size((default, 24)).columns
    return max(columns, 2 * MIN_WIDTH) if columns > 0 else default


def wrap(text: str, width: int, first: str = "", indent: str = "") -> list[str]:
    """Wrap `text` into lines of at most `width` characters, at spaces; a word too long for a line (a path) is
    shortened with `shorten`, so numbers stay whole. `first` starts the first line, `indent` the others.

    >>> wrap("gradient norm at 'encoder.layers.11.self_attn' is small", 28, " 1. ", "    ")
    [' 1. gradient norm at', "    'encoder.….11.self_attn'", '    is small']
    """
    room = max(width - max(len(first), len(indent)), MIN_WIDTH)
    words = [word if len(word) <= room else shorten(word, room) for word in neutralize(text).split(" ")]
    wrapper = textwrap.TextWrapper(
        width=max(width, MIN_WIDTH),
        initial_indent=first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return wrapper.wrap(" ".join(words)) or [first.rstrip()]
