"""Make any name safe to show: HTML-escaped, bidi and control characters made visible, and safe file names."""

from __future__ import annotations

import re
import unicodedata

from .._check import checked
from .._html import text
from .._text import neutralize

__all__ = ["neutralize", "safe_filename", "text"]

_UNSAFE_FILE = re.compile(r"[^A-Za-z0-9._-]+")


@checked()
def safe_filename(name: str, default: str = "model") -> str:
    """Return a file name built from `name` that stays inside its folder (no separators, no dot-only names).

    >>> safe_filename("../../etc/passwd")
    'etc_passwd'
    >>> safe_filename("")
    'model'
    """
    cleaned = _UNSAFE_FILE.sub("_", unicodedata.normalize("NFKC", name)).strip("._-")
    return cleaned[:80] or default
