"""The check registry and `diagnose()`: run checks over `WatchResults`, rank and de-duplicate their findings."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

from .._check import checked
from .._errors import closest_names
from ..results._results import WatchResults
from ._finding import SEVERITIES, Finding, Findings, Severity, rank_findings, severity_rank
from ._gradients import check_exploding_gradients, check_vanishing_gradients
from ._init import check_bad_init, check_unobserved
from ._learning_rate import check_lr_too_high, check_lr_too_low
from ._nonfinite import check_nonfinite_backward, check_nonfinite_forward
from ._series import layer_order
from ._thresholds import Thresholds
from ._transformers import (
    check_adam_epsilon,
    check_attention_entropy_collapse,
    check_attention_logit_growth,
    check_attention_sink,
    check_loss_spike,
    check_massive_activation,
)
from ._units import check_dead_units, check_saturation, check_symmetry

__all__ = ["Check", "CheckSpec", "diagnose", "list_checks", "register_check", "resolve_checks", "unregister_check"]

Check: TypeAlias = Callable[[WatchResults, Thresholds], Iterable[Finding]]
"""`check(results, thresholds) -> iterable of Finding`: pure, reads the results and never changes them."""

CheckSpec: TypeAlias = str | Iterable["str | Check"] | Mapping[str, Check]  # a str: one check name

_BUILTIN: dict[str, Check] = {
    "nonfinite_forward": check_nonfinite_forward,
    "nonfinite_backward": check_nonfinite_backward,
    "bad_init": check_bad_init,
    "symmetry": check_symmetry,
    "lr_too_high": check_lr_too_high,
    "lr_too_low": check_lr_too_low,
    "exploding_gradients": check_exploding_gradients,
    "vanishing_gradients": check_vanishing_gradients,
    "dead_units": check_dead_units,
    "saturation": check_saturation,
    "unobserved": check_unobserved,
    "attention_logit_growth": check_attention_logit_growth,
    "attention_entropy_collapse": check_attention_entropy_collapse,
    "adam_epsilon_too_large": check_adam_epsilon,
    "loss_spike": check_loss_spike,
    "massive_activation": check_massive_activation,
    "attention_sink": check_attention_sink,
}
_REGISTRY: dict[str, Check] = dict(_BUILTIN)


def list_checks() -> list[str]:
    """Return the names of the registered checks, in the order they rank (built-ins first)."""
    return list(_REGISTRY)


def register_check(name: str, check: Check, *, replace: bool = False) -> None:
    """Add `check` to the checks every `diagnose()` runs; `check(results, thresholds) -> iterable of Finding`.

    Raises:
        ValueError: `name` is empty or already registered (pass `replace=True` to swap it).
        TypeError: `check` is not callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if not callable(check):
        raise TypeError(f"check must be callable as check(results, thresholds), got {check!r}")
    if name in _REGISTRY and not replace:
        raise ValueError(f"name must not be a registered check, got {name!r}; pass replace=True to swap it")
    _REGISTRY[name] = check


def unregister_check(name: str) -> None:
    """Remove a registered check (a built-in comes back with `register_check(name, fn)`).

    Raises:
        ValueError: `name` is not registered (the closest names are listed).
    """
    _REGISTRY.pop(_known(name, "name"))


def _known(name: str, argument: str) -> str:
    if name not in _REGISTRY:
        close = ", ".join(repr(c) for c in closest_names(str(name), _REGISTRY, n=3))
        raise ValueError(
            f"{argument} must name a registered check, got {name!r}. Closest: {close or 'none'}."
            " See hookscope.doctor.list_checks()."
        )
    return name


def resolve_checks(checks: CheckSpec | None = None, disable: str | Iterable[str] = ()) -> dict[str, Check]:
    """Turn `checks`/`disable` arguments into `{name: check}` (see `diagnose`), validating every name.

    Raises:
        ValueError: a name is not registered.
        TypeError: an entry is neither a name nor a callable.
    """
    if isinstance(disable, str):
        disable = (disable,)
    if checks is None:
        chosen = dict(_REGISTRY)
    elif isinstance(checks, Mapping):
        chosen = dict(checks)
    else:
        chosen = {}
        for entry in (checks,) if isinstance(checks, str) else checks:
            if isinstance(entry, str):
                chosen[entry] = _REGISTRY[_known(entry, "checks")]
            elif callable(entry):
                chosen[getattr(entry, "__name__", repr(entry))] = entry
            else:
                raise TypeError(f"checks entries must be check names or callables, got {entry!r}")
    skipped = {name if name in chosen else _known(name, "disable") for name in disable}
    return {name: fn for name, fn in chosen.items() if name not in skipped}


def _run(name: str, check: Check, results: WatchResults, thresholds: Thresholds) -> list[Finding]:
    try:
        found = list(check(results, thresholds))
    except Exception as err:
        raise RuntimeError(f"check {name!r} failed on these results: {type(err).__name__}: {err}") from err
    for finding in found:
        if not isinstance(finding, Finding):
            raise TypeError(f"check {name!r} must return Finding objects, got {finding!r}")
    return found


def run_checks(
    results: WatchResults, checks: Mapping[str, Check], thresholds: Thresholds, min_severity: Severity = "info"
) -> Findings:
    """Run resolved checks and return their findings ranked, one per (check, path), at least `min_severity`."""
    found = [f for name, check in checks.items() for f in _run(name, check, results, thresholds)]
    limit = severity_rank(min_severity)
    ranked = rank_findings(
        (f for f in found if severity_rank(f.severity) <= limit), [*_REGISTRY, *checks], layer_order(results)
    )
    unique: dict[tuple[str, str | None], Finding] = {}
    for finding in ranked:
        unique.setdefault(finding.key, finding)
    return Findings(unique.values())


def check_severity(min_severity: Any) -> Severity:
    """Validate a `min_severity` argument.

    Raises:
        ValueError: not one of `SEVERITIES`.
    """
    if min_severity not in SEVERITIES:
        raise ValueError(f"min_severity must be one of {SEVERITIES}, got {min_severity!r}")
    return min_severity  # type: ignore[no-any-return]


@checked()
def diagnose(
    results: WatchResults,
    *,
    checks: CheckSpec | None = None,
    disable: str | Iterable[str] = (),
    thresholds: Thresholds | None = None,
    min_severity: Severity = "info",
    **overrides: float,
) -> Findings:
    """Run the checks over what `watch()` collected and return the findings, most important first.

    Ranking: errors, then warnings, then info; within one severity the earliest step first (the first thing
    that went wrong is the likeliest cause), then check order (`list_checks()`), then forward order. A check
    reports at most one finding per layer (the highest ranked).

    Args:
        results: the collected series (`watch.results()` or `WatchResults.load(path)`).
        checks: which checks to run: `None` (every registered one), names, callables
            `check(results, thresholds) -> iterable of Finding`, or a `{name: check}` mapping.
        disable: names of checks to skip.
        thresholds: a `Thresholds`; defaults to `Thresholds()`.
        min_severity: drop findings less severe than this (`"error"`, `"warning"` or `"info"`).
        **overrides: individual thresholds by name (`dead_unit_fraction=0.3`), applied over `thresholds`.

    Returns:
        The ranked findings, a list (`Findings`, which a notebook shows as the doctor's list); empty when nothing
        looks wrong.

    Raises:
        TypeError: `results` is not a `WatchResults`, or a check returned something else than findings.
        ValueError: an unknown check or threshold name, or a threshold out of range.
        RuntimeError: a check raised (the check's name is in the message; the cause is chained).

    Example:
        >>> import torch
        >>> from hookscope import WatchResults
        >>> results = WatchResults(
        ...     steps=torch.arange(3),
        ...     layers={"0": "Linear", "1": "ReLU"},
        ...     unit_activity={"1": torch.tensor([0.0, 0.0, 0.0, 0.4])},
        ... )
        >>> [(f.check, f.path, f.step) for f in diagnose(results)]
        [('dead_units', '1', 2)]
        >>> diagnose(results)[0].message
        '3 of 4 units (75%) were active (> 0) < 1% of the time over 3 recorded steps, 3 of them never'
        >>> diagnose(results, dead_unit_fraction=0.8, disable=["unobserved"])
        []
    """
    if not isinstance(results, WatchResults):
        raise TypeError(f"results must be a hookscope WatchResults (from watch.results()), got {type(results)!r}")
    if thresholds is not None and not isinstance(thresholds, Thresholds):
        raise TypeError(f"thresholds must be a hookscope.doctor.Thresholds or None, got {thresholds!r}")
    resolved = (thresholds or Thresholds()).replace(**overrides) if overrides else thresholds or Thresholds()
    return run_checks(results, resolve_checks(checks, disable), resolved, check_severity(min_severity))
