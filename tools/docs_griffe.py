"""A griffe extension for the documentation site: Google-style `Example:` sections read as examples.

Griffe's Google parser knows `Examples:` only and renders `Example:` (this project's spelling, which Google style
also allows) as a plain admonition, so the doctest output in it would be read as Markdown. Loaded by mkdocs.yml.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", flags=re.M)


class ExampleSections(griffe.Extension):
    """Rename each docstring's `Example:` section header to `Examples:` before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
