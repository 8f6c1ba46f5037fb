"""`LiveDoctor`: diagnose results again and again while training runs, and report each finding only once."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from ..results._results import WatchResults
from ._diagnose import CheckSpec, check_severity, resolve_checks, run_checks
from ._finding import DiagnosisWarning, Finding, Findings, Severity, severity_rank
from ._thresholds import Thresholds

__all__ = ["LiveDoctor"]


class LiveDoctor:
    """Run `diagnose` on fresh results periodically and return only what was not reported before.

    A finding is identified by `(check, path)`: once reported it stays quiet while its figures or step change,
    and is reported again only if it becomes more severe (a warning turning into an error). This is what
    `watch(..., doctor=True)` uses to warn once per finding rather than every step.

    Args:
        checks: as in `diagnose` (`None`: every registered check).
        disable: names of checks to skip.
        thresholds: a `Thresholds`; defaults to `Thresholds()`.
        min_severity: ignore findings less severe than this; `"warning"` by default, so info never warns.
        **overrides: individual thresholds by name, applied over `thresholds`.

    Raises:
        ValueError: an unknown check or threshold name, a threshold out of range, a bad `min_severity`.

    Example:
        >>> from hookscope.doctor import LiveDoctor
        >>> from hookscope import WatchResults
        >>> doctor = LiveDoctor()
        >>> doctor.update(WatchResults())
        []
    """

    def __init__(
        self,
        *,
        checks: CheckSpec | None = None,
        disable: Iterable[str] = (),
        thresholds: Thresholds | None = None,
        min_severity: Severity = "warning",
        **overrides: float,
    ) -> None:
        if thresholds is not None and not isinstance(thresholds, Thresholds):
            raise TypeError(f"thresholds must be a hookscope.doctor.Thresholds or None, got {thresholds!r}")
        base = thresholds or Thresholds()
        self.thresholds = base.replace(**overrides) if overrides else base
        self.checks = resolve_checks(checks, disable)
        self.min_severity = check_severity(min_severity)
        self._reported: dict[tuple[str, str | None], Finding] = {}

    @property
    def reported(self) -> list[Finding]:
        """Every finding reported so far, as it was when reported, in that order."""
        return list(self._reported.values())

    def update(self, results: WatchResults, *, warn: bool = False, stacklevel: int = 2) -> Findings:
        """Diagnose `results` and return the findings not reported before (ranked).

        Args:
            results: the results so far (each call looks at all of them again; the checks are cheap).
            warn: also emit one `DiagnosisWarning` per new finding.
            stacklevel: passed to `warnings.warn` (2: the caller of `update`).

        Raises:
            TypeError: `results` is not a `WatchResults`.
        """
        if not isinstance(results, WatchResults):
            raise TypeError(f"results must be a hookscope WatchResults, got {type(results)!r}")
        new = Findings()
        for finding in run_checks(results, self.checks, self.thresholds, self.min_severity):
            before = self._reported.get(finding.key)
            if before is None or severity_rank(finding.severity) < severity_rank(before.severity):
                new.append(finding)
                self._reported[finding.key] = finding
        if warn:
            for finding in new:
                advice = f" -> {finding.advice}" if finding.advice else ""
                warnings.warn(f"{finding}{advice}", DiagnosisWarning, stacklevel=stacklevel)
        return new

    def reset(self) -> None:
        """Forget what was reported: every current finding will be reported again."""
        self._reported.clear()

    def state_dict(self) -> dict[str, Any]:
        """What was reported, as plain JSON-able data (so a resumed run does not warn again)."""
        return {"version": 1, "reported": [finding.to_dict() for finding in self._reported.values()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved.

        Raises:
            ValueError: `state` is not a LiveDoctor state dict.
        """
        if not isinstance(state, dict) or state.get("version") != 1 or not isinstance(state.get("reported"), list):
            raise ValueError(f"state must be a LiveDoctor.state_dict() (version 1), got {state!r:.200}")
        findings = [Finding(**{**item, "evidence": dict(item.get("evidence") or {})}) for item in state["reported"]]
        self._reported = {finding.key: finding for finding in findings}
