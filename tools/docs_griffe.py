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


class OptionSignatures(griffe.Extension):
    """Show `watch()` and `Watch()` with every keyword, as `inspect.signature` does at run time.

    Their source says `**options` (the keywords are written once, as the fields of `WatchOptions`, and given to them
    by `options_signature`); the page lists the fields in their place, with annotations and defaults.
    """

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "hookscope":
            return
        fields = pkg["watch._options.WatchOptions"]
        keywords = [
            griffe.Parameter(
                member.name, annotation=member.annotation, kind=griffe.ParameterKind.keyword_only, default=member.value
            )
            for member in fields.members.values()
            if member.is_attribute and not member.name.startswith("_") and member.annotation is not None
        ]
        for path in ("watch._api.watch", "watch._watch.Watch.__init__"):
            function = pkg[path]
            kept = [p for p in function.parameters if p.kind is not griffe.ParameterKind.var_keyword]
            function.parameters = griffe.Parameters(*kept, *keywords)
