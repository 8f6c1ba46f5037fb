"""The CLI's own error: a user mistake (bad argument, missing file) that exits with 2 after one line."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A mistake in what the user asked for; the message says what to change."""
