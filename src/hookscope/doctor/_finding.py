"""`Finding`: one thing the doctor found wrong, where, when, on what evidence, and what to do about it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._check import checked
from .._errors import HookscopeWarning
from .._text import ROOT, quoted, terminal_width, wrap

__all__ = ["SEVERITIES", "DiagnosisWarning", "Finding", "Severity", "format_findings", "rank_findings"]

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
"""Severities, most severe first: `error` (training is broken), `warning` (it is likely to go wrong or learn
badly), `info` (worth knowing, nothing to fix by itself)."""

Evidence = dict[str, float | int | str | None]


class DiagnosisWarning(HookscopeWarning):
    """The doctor found something wrong while the model trains (one warning per finding)."""


@dataclass(frozen=True, eq=True)
class Finding:
    """One diagnosis: what check fired, how bad it is, at which layer and step, on what figures, and the fix.

    Attributes:
        check: the name of the check that produced it (`diagnose(disable=...)` takes these names).
        severity: `"error"`, `"warning"` or `"info"` (`SEVERITIES`).
        path: the module path it concerns (normalized, as in `WatchResults.layers`), or `None` for the whole
            model (a learning rate, the loss).
        step: the training step where it was first seen (or as of which it holds), or `None`.
        message: what is wrong, in one line, with the key figures.
        evidence: the figures that triggered it (name -> number or short text).
        advice: what to try, in one line.
    """

    check: str
    severity: Severity
    path: str | None
    step: int | None
    message: str
    evidence: Evidence = field(default_factory=dict, hash=False)
    advice: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        if not isinstance(self.check, str) or not self.check:
            raise ValueError(f"check must be a non-empty str naming the check, got {self.check!r}")

    @property
    def key(self) -> tuple[str, str | None]:
        """`(check, path)`: what identifies a finding across steps (its figures and step may change)."""
        return (self.check, self.path)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (non-finite evidence numbers become `None`)."""
        evidence = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in self.evidence.items()}
        return {
            "check": self.check,
            "severity": self.severity,
            "path": self.path,
            "step": self.step,
            "message": self.message,
            "evidence": evidence,
            "advice": self.advice,
        }

    def __str__(self) -> str:
        where = "model" if self.path is None else repr(self.path) if self.path else ROOT
        when = "" if self.step is None else f" at step {self.step}"
        return f"{self.severity}: [{self.check}] {where}{when}: {self.message}"


def severity_rank(severity: str) -> int:
    """Return 0 for `error`, 1 for `warning`, 2 for `info` (lower is more severe)."""
    return SEVERITIES.index(severity)


def rank_findings(
    findings: Iterable[Finding], check_order: Sequence[str] = (), layer_order: Sequence[str] = ()
) -> list[Finding]:
    """Sort findings: most severe first, then earliest step, then check order, then layer order.

    Earliest first because the first thing that went wrong is the likeliest cause of what followed.
    """
    checks: dict[str, int] = {}
    for name in check_order:
        checks.setdefault(name, len(checks))
    layers = {path: i for i, path in enumerate(layer_order)}

    def key(finding: Finding) -> tuple[int, float, int, int, str]:
        step = math.inf if finding.step is None else finding.step
        layer = -1 if finding.path is None else layers.get(finding.path, len(layers))
        return (
            severity_rank(finding.severity),
            step,
            checks.get(finding.check, len(checks)),
            layer,
            finding.path or "",
        )

    return sorted(findings, key=key)


@checked()
def format_findings(findings: Sequence[Finding], *, limit: int | None = None, width: int | None = None) -> str:
    """Render findings as a short numbered list, in the order given (`diagnose` returns them ranked).

    Each finding starts with its severity, check, layer, step and message, then the advice after `->`; lines are
    wrapped to `width`, and a layer path too long for it is shortened in the middle (`hookscope._text.shorten_path`).

    Args:
        findings: the findings to render.
        limit: show at most this many (the rest are counted in a last line); `None` shows all.
        width: the most characters per line; `None`: the terminal's width (100 when there is no terminal).

    Raises:
        ValueError: `limit` is not a positive int or None, or `width` is not an int >= 40 or None.

    Example:
        >>> found = Finding("lr_too_high", "warning", None, 0, "updates 50x the guide", {}, "Lower the lr.")
        >>> print(format_findings([found], width=80))
        hookscope doctor: 1 finding (1 warning)
         1. WARNING lr_too_high (model) step 0: updates 50x the guide
            -> Lower the lr.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")
    if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 40):
        raise ValueError(f"width must be an int >= 40 or None (the terminal's width), got {width!r}")
    if not findings:
        return "hookscope doctor: no findings."
    columns = terminal_width() if width is None else width
    counts = [(s, sum(f.severity == s for f in findings)) for s in SEVERITIES]
    summary = ", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts if n)
    lines = [f"hookscope doctor: {len(findings)} finding{'s' if len(findings) != 1 else ''} ({summary})"]
    shown = findings if limit is None else findings[:limit]
    for i, finding in enumerate(shown, 1):
        where = "(model)" if finding.path is None else quoted(finding.path, columns // 2)
        when = "" if finding.step is None else f" step {finding.step}"
        head = f"{i:>2}. {finding.severity.upper():<7} {finding.check} {where}{when}:"
        lines += wrap(f"{head} {finding.message}", columns, indent="    ")
        if finding.advice:
            lines += wrap(f"-> {finding.advice}", columns, first="    ", indent="       ")
    if len(shown) < len(findings):
        lines.append(f"    ... and {len(findings) - len(shown)} more")
    return "\n".join(lines)
