"""The CLI's own errors: a user mistake (exit 2) and a missing optional extra (exit 3), each one line."""

from __future__ import annotations

import importlib.util

__all__ = [
    "EXIT_MISSING_EXTRA",
    "EXTRAS",
    "MissingExtraError",
    "UsageError",
    "extra_of_module",
    "is_installed",
    "missing_of",
    "require_extra",
]

EXIT_MISSING_EXTRA = 3
"""The exit code of a command that needs an optional extra that is not installed."""

EXTRAS: dict[str, dict[str, str]] = {
    "plot": {"matplotlib": "matplotlib"},
    "cli": {"rich": "rich", "sklearn": "scikit-learn", "matplotlib": "matplotlib"},
}
"""Each extra of pyproject.toml the CLI relies on: the modules it imports and the distribution that installs each."""


class UsageError(ValueError):
    """A mistake in what the user asked for; the message says what to change."""


class MissingExtraError(RuntimeError):
    """An optional dependency is not installed; the message names the extra that installs it.

    Args:
        needed_for: What could not run (`hookscope demo`, `drawing report.html`).
        extra: The extra of pyproject.toml that installs the missing modules.
        missing: The distributions that are missing.
        then: What to do after installing it (optional, e.g. the command that finishes the job).
    """

    def __init__(self, needed_for: str, extra: str, missing: list[str], then: str = "") -> None:
        self.extra = extra
        self.missing = missing
        after = f", then {then}" if then else ""
        super().__init__(
            f"{needed_for} needs {', '.join(missing)}, not installed: pip install 'hookscope[{extra}]'{after}"
        )


def is_installed(module: str) -> bool:
    """Return whether the top-level `module` can be imported (found on the path; nothing is imported)."""
    return importlib.util.find_spec(module) is not None


def missing_of(extra: str) -> list[str]:
    """Return the distributions of `extra` whose module cannot be found, in pyproject's order."""
    return [dist for module, dist in EXTRAS[extra].items() if not is_installed(module)]


def require_extra(extra: str, needed_for: str, then: str = "") -> None:
    """Raise `MissingExtraError` naming `extra` when one of its modules is not installed.

    Raises:
        MissingExtraError: a module of `extra` cannot be imported.
    """
    missing = missing_of(extra)
    if missing:
        raise MissingExtraError(needed_for, extra, missing, then)


def extra_of_module(name: str | None) -> str | None:
    """Return the smallest extra that installs the top-level module of `name` (a `ModuleNotFoundError.name`)."""
    top = (name or "").partition(".")[0]
    extras = sorted((extra for extra, modules in EXTRAS.items() if top in modules), key=lambda e: len(EXTRAS[e]))
    return extras[0] if extras else None
