"""`Finding`: one thing the doctor found wrong, where, when, on what evidence, and what to do about it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._check import checked
from .._errors import HookscopeWarning
from .._html import text
from .._text import ROOT, display_name, quoted, terminal_width, wrap

__all__ = [
    "SEVERITIES", "SEVERITY_COLORS", "DiagnosisWarning", "Finding", "Findings", "Severity", "findings_html",
    "format_findings", "rank_findings",
]  # fmt: skip

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
"""Severities, most severe first: `error` (training is broken), `warning` (it is likely to go wrong or learn
badly), `info` (worth knowing, nothing to fix by itself)."""

SEVERITY_COLORS: dict[str, str] = {"error": "#d9534f", "warning": "#f0ad4e", "info": "#5bc0de"}
"""The colour of each severity where findings are drawn (the report's style sheet uses the same)."""

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
    lines = [f"hookscope doctor: {_summary_line(findings)}"]
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


class Findings(list[Finding]):
    """The doctor's findings: a plain list (ranked, as `diagnose` returns them) that a notebook shows as a
    severity-coloured list (`findings_html`); `format_findings(findings)` is the same in text.

    Slices and copies are plain lists; `Findings(a_list)` makes one again.
    """

    def _repr_html_(self) -> str:
        return findings_html(self)


def _summary_line(findings: Sequence[Finding]) -> str:
    """`3 findings (1 error, 2 warnings)`, or `no findings.`"""
    if not findings:
        return "no findings."
    counts = [(s, sum(f.severity == s for f in findings)) for s in SEVERITIES]
    summary = ", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts if n)
    return f"{len(findings)} finding{'s' if len(findings) != 1 else ''} ({summary})"


@checked()
def findings_html(findings: Sequence[Finding], *, limit: int | None = 50) -> str:
    """Render findings as an HTML fragment: `format_findings`' list, each finding's severity in its colour.

    Every name and message is escaped (`hookscope._html.text`); layer paths are shown whole (the notebook wraps
    them), as the evidence figures are.

    Args:
        findings: the findings, in the order given (`diagnose` returns them ranked).
        limit: show at most this many (the rest are counted); `None` shows all.

    Raises:
        ValueError: `limit` is not a positive int or None.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")
    head = f"<p style='margin:.3em 0'><b>hookscope doctor</b>: {text(_summary_line(findings))}</p>"
    shown = findings if limit is None else findings[:limit]
    items = "".join(_finding_html(index, finding) for index, finding in enumerate(shown, 1))
    more = f"<p style='color:#667'>... and {len(findings) - len(shown)} more</p>" if len(shown) < len(findings) else ""
    listing = f"<ol style='padding:0;margin:0'>{items}</ol>" if items else ""
    return f"<div class='hookscope-findings'>{head}{listing}{more}</div>"


def _finding_html(index: int, finding: Finding) -> str:
    color = SEVERITY_COLORS.get(finding.severity, "#999")
    where = "model" if finding.path is None else f"layer {display_name(finding.path)}"
    place = where + ("" if finding.step is None else f" · step {finding.step}")
    parts = [
        f"<span style='font-weight:bold;text-transform:uppercase;font-size:.8em;color:{color}'>"
        f"{index}. {text(finding.severity)}</span> <b>{text(finding.check)}</b> "
        f"<span style='color:#667'>{text(place)}</span>",
        f"<div>{text(finding.message)}</div>",
    ]
    if finding.evidence:
        figures = "; ".join(f"{key} = {value}" for key, value in finding.evidence.items())
        parts.append(f"<div style='color:#667;font-size:.9em'>{text(figures)}</div>")
    if finding.advice:
        parts.append(f"<div><i>-&gt; {text(finding.advice)}</i></div>")
    style = f"border-left:5px solid {color};background:#f7f8fa;margin:.35em 0;padding:.3em .8em;list-style:none"
    return f"<li class='finding sev-{text(finding.severity)}' style='{style}'>{''.join(parts)}</li>"
